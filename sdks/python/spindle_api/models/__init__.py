""" Contains all the data models used in inputs/outputs """

from .accepted_job import AcceptedJob
from .attempt_list import AttemptList
from .attempt_view import AttemptView
from .backfill_reply import BackfillReply
from .backfill_request import BackfillRequest
from .backfilled_event import BackfilledEvent
from .blocked_key import BlockedKey
from .endpoint_health import EndpointHealth
from .endpoints_view import EndpointsView
from .error_body import ErrorBody
from .error_detail import ErrorDetail
from .event_batch import EventBatch
from .event_delivery import EventDelivery
from .event_link import EventLink
from .event_list import EventList
from .event_view import EventView
from .import_job import ImportJob
from .import_job_payload import ImportJobPayload
from .import_request import ImportRequest
from .import_response import ImportResponse
from .job_description import JobDescription
from .job_list import JobList
from .job_spec import JobSpec
from .job_spec_headers_type_0 import JobSpecHeadersType0
from .job_status import JobStatus
from .job_view import JobView
from .job_view_headers import JobViewHeaders
from .kept_event import KeptEvent
from .kept_event_envelope import KeptEventEnvelope
from .new_event import NewEvent
from .new_subscription import NewSubscription
from .new_subscription_headers_type_0 import NewSubscriptionHeadersType0
from .ordering_failure import OrderingFailure
from .past_event import PastEvent
from .payload_filter import PayloadFilter
from .publish_batch_reply import PublishBatchReply
from .publish_reply import PublishReply
from .submit_request import SubmitRequest
from .submit_response import SubmitResponse
from .subscription_list import SubscriptionList
from .subscription_patch import SubscriptionPatch
from .subscription_view import SubscriptionView
from .subscription_view_headers import SubscriptionViewHeaders
from .transition_view import TransitionView

__all__ = (
    "AcceptedJob",
    "AttemptList",
    "AttemptView",
    "BackfilledEvent",
    "BackfillReply",
    "BackfillRequest",
    "BlockedKey",
    "EndpointHealth",
    "EndpointsView",
    "ErrorBody",
    "ErrorDetail",
    "EventBatch",
    "EventDelivery",
    "EventLink",
    "EventList",
    "EventView",
    "ImportJob",
    "ImportJobPayload",
    "ImportRequest",
    "ImportResponse",
    "JobDescription",
    "JobList",
    "JobSpec",
    "JobSpecHeadersType0",
    "JobStatus",
    "JobView",
    "JobViewHeaders",
    "KeptEvent",
    "KeptEventEnvelope",
    "NewEvent",
    "NewSubscription",
    "NewSubscriptionHeadersType0",
    "OrderingFailure",
    "PastEvent",
    "PayloadFilter",
    "PublishBatchReply",
    "PublishReply",
    "SubmitRequest",
    "SubmitResponse",
    "SubscriptionList",
    "SubscriptionPatch",
    "SubscriptionView",
    "SubscriptionViewHeaders",
    "TransitionView",
)
