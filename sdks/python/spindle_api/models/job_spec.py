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
  from ..models.job_spec_headers_type_0 import JobSpecHeadersType0





T = TypeVar("T", bound="JobSpec")



@_attrs_define
class JobSpec:
    """ One job to deliver.

        Attributes:
            bucket (str): Isolation key: a tenant or a source–destination pair (1–128 characters, no control
                characters).
            endpoint (str): The http or https URL to deliver to (at most 2048 bytes).
            backoff_coefficient (float | None | Unset): Growth of the delay per attempt (1.0..=10.0, default 2.0).
            backoff_min_delay_ms (int | None | Unset): Delay before the second attempt in ms (1..=3600000, default 1000).
            delay_ms (int | None | Unset): Wait this many ms before the first attempt (at most the longest time to live); as
                `deliver_at` = now + `delay_ms`. Excludes `deliver_at`.
            deliver_at (datetime.datetime | None | Unset): When to make the first attempt (RFC 3339, at most the longest
                time to live ahead; a time
                passed means now). The job waits in the JobDB until then, and `ttl_ms` counts from
                then. Excludes `delay_ms`.
            execution_timeout_ms (int | None | Unset): Deadline of one attempt in ms (10..=300000, default 10000).
            expire_at (datetime.datetime | None | Unset): When to stop retrying and archive (RFC 3339, in the future).
                Excludes `ttl_ms`.
            headers (JobSpecHeadersType0 | None | Unset): Request headers (at most 64): token names, values without control
                characters.
            idempotency_key (None | str | Unset): The producer's idempotency key (1 to 255 characters); stored with the job.
            method (None | str | Unset): HTTP method: POST (default), PUT, PATCH, DELETE or GET.
            on_complete (None | str | Unset): An http or https URL (at most 2048 bytes) told when the job ends: once it
                succeeds, is
                discarded or expires, a JSON notice of how it ended (`type` `job.completed`, `job_id`,
                `bucket`, `endpoint`, `state`, `attempts`, `response_status`, `error_type`,
                `created_at`, `ended_at`) is delivered there as a job of its own, in the same bucket,
                signed like the bucket's jobs and retried like any job (4 h to live). Written with the
                row that ends the job: never lost, never sent twice for one ending.
            ordering_failure (None | OrderingFailure | Unset):
            ordering_key (None | str | Unset): Jobs of one bucket and endpoint that share an ordering key (1 to 255 bytes)
                are
                delivered one at a time, in the order they were accepted: the next is sent only after
                the previous ended (succeeded, discarded or expired). A failing job holds only its own
                key's later jobs; other keys and unordered jobs go on.
            payload (Any | Unset): The body, as any JSON value (sent as `application/json` unless headers say otherwise).
                Kept as the exact bytes given: never parsed into a tree and re-serialized.
            payload_base64 (None | str | Unset): The body, as base64 bytes (sent as `application/octet-stream` unless
                headers say otherwise).
            traceparent (None | str | Unset): The W3C trace context of the producer's span (`00-<trace id>-<span
                id>-<flags>`), for
                a job of a batch that was made in a trace of its own; otherwise the request's
                `traceparent` header applies. Stored with the job: each attempt is a span linked to it.
            tracestate (None | str | Unset): The W3C `tracestate` that goes with `traceparent` (at most 512 bytes).
            ttl_ms (int | None | Unset): Time to live in ms (default 4 h, at most 30 days). Excludes `expire_at`.
     """

    bucket: str
    endpoint: str
    backoff_coefficient: float | None | Unset = UNSET
    backoff_min_delay_ms: int | None | Unset = UNSET
    delay_ms: int | None | Unset = UNSET
    deliver_at: datetime.datetime | None | Unset = UNSET
    execution_timeout_ms: int | None | Unset = UNSET
    expire_at: datetime.datetime | None | Unset = UNSET
    headers: JobSpecHeadersType0 | None | Unset = UNSET
    idempotency_key: None | str | Unset = UNSET
    method: None | str | Unset = UNSET
    on_complete: None | str | Unset = UNSET
    ordering_failure: None | OrderingFailure | Unset = UNSET
    ordering_key: None | str | Unset = UNSET
    payload: Any | Unset = UNSET
    payload_base64: None | str | Unset = UNSET
    traceparent: None | str | Unset = UNSET
    tracestate: None | str | Unset = UNSET
    ttl_ms: int | None | Unset = UNSET





    def to_dict(self) -> dict[str, Any]:
        from ..models.job_spec_headers_type_0 import JobSpecHeadersType0 # noqa: PLC0415
        bucket = self.bucket

        endpoint = self.endpoint

        backoff_coefficient: float | None | Unset
        if isinstance(self.backoff_coefficient, Unset):
            backoff_coefficient = UNSET
        else:
            backoff_coefficient = self.backoff_coefficient

        backoff_min_delay_ms: int | None | Unset
        if isinstance(self.backoff_min_delay_ms, Unset):
            backoff_min_delay_ms = UNSET
        else:
            backoff_min_delay_ms = self.backoff_min_delay_ms

        delay_ms: int | None | Unset
        if isinstance(self.delay_ms, Unset):
            delay_ms = UNSET
        else:
            delay_ms = self.delay_ms

        deliver_at: None | str | Unset
        if isinstance(self.deliver_at, Unset):
            deliver_at = UNSET
        elif isinstance(self.deliver_at, datetime.datetime):
            deliver_at = self.deliver_at.isoformat()
        else:
            deliver_at = self.deliver_at

        execution_timeout_ms: int | None | Unset
        if isinstance(self.execution_timeout_ms, Unset):
            execution_timeout_ms = UNSET
        else:
            execution_timeout_ms = self.execution_timeout_ms

        expire_at: None | str | Unset
        if isinstance(self.expire_at, Unset):
            expire_at = UNSET
        elif isinstance(self.expire_at, datetime.datetime):
            expire_at = self.expire_at.isoformat()
        else:
            expire_at = self.expire_at

        headers: dict[str, Any] | None | Unset
        if isinstance(self.headers, Unset):
            headers = UNSET
        elif isinstance(self.headers, JobSpecHeadersType0):
            headers = self.headers.to_dict()
        else:
            headers = self.headers

        idempotency_key: None | str | Unset
        if isinstance(self.idempotency_key, Unset):
            idempotency_key = UNSET
        else:
            idempotency_key = self.idempotency_key

        method: None | str | Unset
        if isinstance(self.method, Unset):
            method = UNSET
        else:
            method = self.method

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

        payload = self.payload

        payload_base64: None | str | Unset
        if isinstance(self.payload_base64, Unset):
            payload_base64 = UNSET
        else:
            payload_base64 = self.payload_base64

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

        ttl_ms: int | None | Unset
        if isinstance(self.ttl_ms, Unset):
            ttl_ms = UNSET
        else:
            ttl_ms = self.ttl_ms


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "bucket": bucket,
            "endpoint": endpoint,
        })
        if backoff_coefficient is not UNSET:
            field_dict["backoff_coefficient"] = backoff_coefficient
        if backoff_min_delay_ms is not UNSET:
            field_dict["backoff_min_delay_ms"] = backoff_min_delay_ms
        if delay_ms is not UNSET:
            field_dict["delay_ms"] = delay_ms
        if deliver_at is not UNSET:
            field_dict["deliver_at"] = deliver_at
        if execution_timeout_ms is not UNSET:
            field_dict["execution_timeout_ms"] = execution_timeout_ms
        if expire_at is not UNSET:
            field_dict["expire_at"] = expire_at
        if headers is not UNSET:
            field_dict["headers"] = headers
        if idempotency_key is not UNSET:
            field_dict["idempotency_key"] = idempotency_key
        if method is not UNSET:
            field_dict["method"] = method
        if on_complete is not UNSET:
            field_dict["on_complete"] = on_complete
        if ordering_failure is not UNSET:
            field_dict["ordering_failure"] = ordering_failure
        if ordering_key is not UNSET:
            field_dict["ordering_key"] = ordering_key
        if payload is not UNSET:
            field_dict["payload"] = payload
        if payload_base64 is not UNSET:
            field_dict["payload_base64"] = payload_base64
        if traceparent is not UNSET:
            field_dict["traceparent"] = traceparent
        if tracestate is not UNSET:
            field_dict["tracestate"] = tracestate
        if ttl_ms is not UNSET:
            field_dict["ttl_ms"] = ttl_ms

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.job_spec_headers_type_0 import JobSpecHeadersType0 # noqa: PLC0415
        d = dict(src_dict)
        bucket = d.pop("bucket")

        endpoint = d.pop("endpoint")

        def _parse_backoff_coefficient(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        backoff_coefficient = _parse_backoff_coefficient(d.pop("backoff_coefficient", UNSET))


        def _parse_backoff_min_delay_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        backoff_min_delay_ms = _parse_backoff_min_delay_ms(d.pop("backoff_min_delay_ms", UNSET))


        def _parse_delay_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        delay_ms = _parse_delay_ms(d.pop("delay_ms", UNSET))


        def _parse_deliver_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                deliver_at_type_0 = datetime.datetime.fromisoformat(data)



                return deliver_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        deliver_at = _parse_deliver_at(d.pop("deliver_at", UNSET))


        def _parse_execution_timeout_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        execution_timeout_ms = _parse_execution_timeout_ms(d.pop("execution_timeout_ms", UNSET))


        def _parse_expire_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                expire_at_type_0 = datetime.datetime.fromisoformat(data)



                return expire_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        expire_at = _parse_expire_at(d.pop("expire_at", UNSET))


        def _parse_headers(data: object) -> JobSpecHeadersType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                headers_type_0 = JobSpecHeadersType0.from_dict(data)



                return headers_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(JobSpecHeadersType0 | None | Unset, data)

        headers = _parse_headers(d.pop("headers", UNSET))


        def _parse_idempotency_key(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        idempotency_key = _parse_idempotency_key(d.pop("idempotency_key", UNSET))


        def _parse_method(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        method = _parse_method(d.pop("method", UNSET))


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


        payload = d.pop("payload", UNSET)

        def _parse_payload_base64(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        payload_base64 = _parse_payload_base64(d.pop("payload_base64", UNSET))


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


        def _parse_ttl_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        ttl_ms = _parse_ttl_ms(d.pop("ttl_ms", UNSET))


        job_spec = cls(
            bucket=bucket,
            endpoint=endpoint,
            backoff_coefficient=backoff_coefficient,
            backoff_min_delay_ms=backoff_min_delay_ms,
            delay_ms=delay_ms,
            deliver_at=deliver_at,
            execution_timeout_ms=execution_timeout_ms,
            expire_at=expire_at,
            headers=headers,
            idempotency_key=idempotency_key,
            method=method,
            on_complete=on_complete,
            ordering_failure=ordering_failure,
            ordering_key=ordering_key,
            payload=payload,
            payload_base64=payload_base64,
            traceparent=traceparent,
            tracestate=tracestate,
            ttl_ms=ttl_ms,
        )

        return job_spec

