from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..models.ordering_failure import OrderingFailure
from ..types import UNSET, Unset
from typing import cast
import datetime

if TYPE_CHECKING:
  from ..models.event_link import EventLink
  from ..models.transition_view import TransitionView





T = TypeVar("T", bound="JobDescription")



@_attrs_define
class JobDescription:
    """ What a job is, as every view of a stored job shows it (the Director's `GET /v1/jobs/{id}`,
    the dashboard's traces): one type, so a field added to a job is added to every view here.
    Views flatten it and add what only they show.

        Attributes:
            attempts (int): Attempts started so far.
            backoff_coefficient (float): Growth of the delay per attempt.
            backoff_min_delay_ms (int): Delay before the second attempt.
            bucket (str): The bucket.
            created_at (datetime.datetime): When the job was accepted.
            endpoint (str): The endpoint URL.
            execution_timeout_ms (int): Deadline of one attempt.
            expire_at (datetime.datetime): When it stops being retried.
            id (str): The job id (ULID).
            id_hex (str): The id as `HEX(id)` prints it in SQL.
            method (str): The HTTP method.
            state (str): Current state (that of the latest transition). Example: succeeded.
            transitions (list[TransitionView]): Every state transition, oldest first.
            event (EventLink | None | Unset):
            idempotency_key (None | str | Unset): The producer's idempotency key.
            on_complete (None | str | Unset): Where its completion notice goes, if it asked for one.
            ordering_failure (None | OrderingFailure | Unset):
            ordering_key (None | str | Unset): Its ordering key, if it is delivered in order with its key's other jobs.
            traceparent (None | str | Unset): The W3C trace context it was submitted in, which its attempts' spans link to.
            tracestate (None | str | Unset): The `tracestate` that went with it.
     """

    attempts: int
    backoff_coefficient: float
    backoff_min_delay_ms: int
    bucket: str
    created_at: datetime.datetime
    endpoint: str
    execution_timeout_ms: int
    expire_at: datetime.datetime
    id: str
    id_hex: str
    method: str
    state: str
    transitions: list[TransitionView]
    event: EventLink | None | Unset = UNSET
    idempotency_key: None | str | Unset = UNSET
    on_complete: None | str | Unset = UNSET
    ordering_failure: None | OrderingFailure | Unset = UNSET
    ordering_key: None | str | Unset = UNSET
    traceparent: None | str | Unset = UNSET
    tracestate: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.event_link import EventLink # noqa: PLC0415
        from ..models.transition_view import TransitionView # noqa: PLC0415
        attempts = self.attempts

        backoff_coefficient = self.backoff_coefficient

        backoff_min_delay_ms = self.backoff_min_delay_ms

        bucket = self.bucket

        created_at = self.created_at.isoformat()

        endpoint = self.endpoint

        execution_timeout_ms = self.execution_timeout_ms

        expire_at = self.expire_at.isoformat()

        id = self.id

        id_hex = self.id_hex

        method = self.method

        state = self.state

        transitions = []
        for transitions_item_data in self.transitions:
            transitions_item = transitions_item_data.to_dict()
            transitions.append(transitions_item)



        event: dict[str, Any] | None | Unset
        if isinstance(self.event, Unset):
            event = UNSET
        elif isinstance(self.event, EventLink):
            event = self.event.to_dict()
        else:
            event = self.event

        idempotency_key: None | str | Unset
        if isinstance(self.idempotency_key, Unset):
            idempotency_key = UNSET
        else:
            idempotency_key = self.idempotency_key

        on_complete: None | str | Unset
        if isinstance(self.on_complete, Unset):
            on_complete = UNSET
        else:
            on_complete = self.on_complete

        ordering_failure: None | str | Unset
        if isinstance(self.ordering_failure, Unset):
            ordering_failure = UNSET
        elif isinstance(self.ordering_failure, OrderingFailure):
            ordering_failure = self.ordering_failure.value
        else:
            ordering_failure = self.ordering_failure

        ordering_key: None | str | Unset
        if isinstance(self.ordering_key, Unset):
            ordering_key = UNSET
        else:
            ordering_key = self.ordering_key

        traceparent: None | str | Unset
        if isinstance(self.traceparent, Unset):
            traceparent = UNSET
        else:
            traceparent = self.traceparent

        tracestate: None | str | Unset
        if isinstance(self.tracestate, Unset):
            tracestate = UNSET
        else:
            tracestate = self.tracestate


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "attempts": attempts,
            "backoff_coefficient": backoff_coefficient,
            "backoff_min_delay_ms": backoff_min_delay_ms,
            "bucket": bucket,
            "created_at": created_at,
            "endpoint": endpoint,
            "execution_timeout_ms": execution_timeout_ms,
            "expire_at": expire_at,
            "id": id,
            "id_hex": id_hex,
            "method": method,
            "state": state,
            "transitions": transitions,
        })
        if event is not UNSET:
            field_dict["event"] = event
        if idempotency_key is not UNSET:
            field_dict["idempotency_key"] = idempotency_key
        if on_complete is not UNSET:
            field_dict["on_complete"] = on_complete
        if ordering_failure is not UNSET:
            field_dict["ordering_failure"] = ordering_failure
        if ordering_key is not UNSET:
            field_dict["ordering_key"] = ordering_key
        if traceparent is not UNSET:
            field_dict["traceparent"] = traceparent
        if tracestate is not UNSET:
            field_dict["tracestate"] = tracestate

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.event_link import EventLink # noqa: PLC0415
        from ..models.transition_view import TransitionView # noqa: PLC0415
        d = dict(src_dict)
        attempts = d.pop("attempts")

        backoff_coefficient = d.pop("backoff_coefficient")

        backoff_min_delay_ms = d.pop("backoff_min_delay_ms")

        bucket = d.pop("bucket")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))




        endpoint = d.pop("endpoint")

        execution_timeout_ms = d.pop("execution_timeout_ms")

        expire_at = datetime.datetime.fromisoformat(d.pop("expire_at"))




        id = d.pop("id")

        id_hex = d.pop("id_hex")

        method = d.pop("method")

        state = d.pop("state")

        transitions = []
        _transitions = d.pop("transitions")
        for transitions_item_data in (_transitions):
            transitions_item = TransitionView.from_dict(transitions_item_data)



            transitions.append(transitions_item)


        def _parse_event(data: object) -> EventLink | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                event_type_1 = EventLink.from_dict(data)



                return event_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EventLink | None | Unset, data)

        event = _parse_event(d.pop("event", UNSET))


        def _parse_idempotency_key(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        idempotency_key = _parse_idempotency_key(d.pop("idempotency_key", UNSET))


        def _parse_on_complete(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        on_complete = _parse_on_complete(d.pop("on_complete", UNSET))


        def _parse_ordering_failure(data: object) -> None | OrderingFailure | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                ordering_failure_type_1 = OrderingFailure(data)



                return ordering_failure_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | OrderingFailure | Unset, data)

        ordering_failure = _parse_ordering_failure(d.pop("ordering_failure", UNSET))


        def _parse_ordering_key(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        ordering_key = _parse_ordering_key(d.pop("ordering_key", UNSET))


        def _parse_traceparent(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        traceparent = _parse_traceparent(d.pop("traceparent", UNSET))


        def _parse_tracestate(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        tracestate = _parse_tracestate(d.pop("tracestate", UNSET))


        job_description = cls(
            attempts=attempts,
            backoff_coefficient=backoff_coefficient,
            backoff_min_delay_ms=backoff_min_delay_ms,
            bucket=bucket,
            created_at=created_at,
            endpoint=endpoint,
            execution_timeout_ms=execution_timeout_ms,
            expire_at=expire_at,
            id=id,
            id_hex=id_hex,
            method=method,
            state=state,
            transitions=transitions,
            event=event,
            idempotency_key=idempotency_key,
            on_complete=on_complete,
            ordering_failure=ordering_failure,
            ordering_key=ordering_key,
            traceparent=traceparent,
            tracestate=tracestate,
        )


        job_description.additional_properties = d
        return job_description

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
