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
  from ..models.import_job_payload import ImportJobPayload





T = TypeVar("T", bound="ImportJob")



@_attrs_define
class ImportJob:
    """ One job as it was stored in the retired JobDB, with its progress.

        Attributes:
            backoff_coefficient (float): Growth of the delay per attempt.
            backoff_min_delay_ms (int): Delay before the second attempt.
            bucket (str): Its bucket.
            created_at (datetime.datetime): When it was first accepted.
            endpoint (str): Its endpoint URL.
            execution_timeout_ms (int): Deadline of one attempt.
            expire_at (datetime.datetime): When it stops being retried.
            headers (list[list[str]]): Its headers as `[name, value]` pairs, in order.
            id (str): The job's id (ULID), kept.
            method (str): Its HTTP method.
            retry_at (datetime.datetime): When its next attempt is due (new jobs: when they were accepted).
            attempts (int | Unset): Attempts made so far (0 for new jobs).
            event (EventLink | None | Unset):
            idempotency_key (None | str | Unset): The producer's idempotency key.
            on_complete (None | str | Unset): The URL told when it ends (see [`NewJob::on_complete`]).
            ordering_failure (None | OrderingFailure | Unset):
            ordering_key (None | str | Unset): Its ordering key (see [`NewJob::ordering_key`]).
            ordering_position (None | str | Unset): Moves only: its place in its key's order (a ULID the accepting Director
                minted), kept
                so a moved job keeps its turn; a router's new jobs get theirs where they are stored.
            payload (ImportJobPayload | Unset): Its body when it is a JSON value, exactly these bytes (a router forwards a
                job submitted
                with `payload` so: no re-encoding); give this or `payload_base64` (neither: no body).
            payload_base64 (None | str | Unset): Its body, base64, for any bytes.
            traceparent (None | str | Unset): The trace it was submitted in (see [`NewJob::traceparent`]).
            tracestate (None | str | Unset): Its `tracestate`.
     """

    backoff_coefficient: float
    backoff_min_delay_ms: int
    bucket: str
    created_at: datetime.datetime
    endpoint: str
    execution_timeout_ms: int
    expire_at: datetime.datetime
    headers: list[list[str]]
    id: str
    method: str
    retry_at: datetime.datetime
    attempts: int | Unset = UNSET
    event: EventLink | None | Unset = UNSET
    idempotency_key: None | str | Unset = UNSET
    on_complete: None | str | Unset = UNSET
    ordering_failure: None | OrderingFailure | Unset = UNSET
    ordering_key: None | str | Unset = UNSET
    ordering_position: None | str | Unset = UNSET
    payload: ImportJobPayload | Unset = UNSET
    payload_base64: None | str | Unset = UNSET
    traceparent: None | str | Unset = UNSET
    tracestate: None | str | Unset = UNSET





    def to_dict(self) -> dict[str, Any]:
        from ..models.event_link import EventLink # noqa: PLC0415
        from ..models.import_job_payload import ImportJobPayload # noqa: PLC0415
        backoff_coefficient = self.backoff_coefficient

        backoff_min_delay_ms = self.backoff_min_delay_ms

        bucket = self.bucket

        created_at = self.created_at.isoformat()

        endpoint = self.endpoint

        execution_timeout_ms = self.execution_timeout_ms

        expire_at = self.expire_at.isoformat()

        headers = []
        for headers_item_data in self.headers:
            headers_item = headers_item_data


            headers.append(headers_item)



        id = self.id

        method = self.method

        retry_at = self.retry_at.isoformat()

        attempts = self.attempts

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

        ordering_position: None | str | Unset
        if isinstance(self.ordering_position, Unset):
            ordering_position = UNSET
        else:
            ordering_position = self.ordering_position

        payload: dict[str, Any] | Unset = UNSET
        if not isinstance(self.payload, Unset):
            payload = self.payload.to_dict()

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


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "backoff_coefficient": backoff_coefficient,
            "backoff_min_delay_ms": backoff_min_delay_ms,
            "bucket": bucket,
            "created_at": created_at,
            "endpoint": endpoint,
            "execution_timeout_ms": execution_timeout_ms,
            "expire_at": expire_at,
            "headers": headers,
            "id": id,
            "method": method,
            "retry_at": retry_at,
        })
        if attempts is not UNSET:
            field_dict["attempts"] = attempts
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
        if ordering_position is not UNSET:
            field_dict["ordering_position"] = ordering_position
        if payload is not UNSET:
            field_dict["payload"] = payload
        if payload_base64 is not UNSET:
            field_dict["payload_base64"] = payload_base64
        if traceparent is not UNSET:
            field_dict["traceparent"] = traceparent
        if tracestate is not UNSET:
            field_dict["tracestate"] = tracestate

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.event_link import EventLink # noqa: PLC0415
        from ..models.import_job_payload import ImportJobPayload # noqa: PLC0415
        d = dict(src_dict)
        backoff_coefficient = d.pop("backoff_coefficient")

        backoff_min_delay_ms = d.pop("backoff_min_delay_ms")

        bucket = d.pop("bucket")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))




        endpoint = d.pop("endpoint")

        execution_timeout_ms = d.pop("execution_timeout_ms")

        expire_at = datetime.datetime.fromisoformat(d.pop("expire_at"))




        headers = []
        _headers = d.pop("headers")
        for headers_item_data in (_headers):
            headers_item = cast(list[str], headers_item_data)

            headers.append(headers_item)


        id = d.pop("id")

        method = d.pop("method")

        retry_at = datetime.datetime.fromisoformat(d.pop("retry_at"))




        attempts = d.pop("attempts", UNSET)

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


        def _parse_ordering_position(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        ordering_position = _parse_ordering_position(d.pop("ordering_position", UNSET))


        _payload = d.pop("payload", UNSET)
        payload: ImportJobPayload | Unset
        if isinstance(_payload,  Unset):
            payload = UNSET
        else:
            payload = ImportJobPayload.from_dict(_payload)




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


        import_job = cls(
            backoff_coefficient=backoff_coefficient,
            backoff_min_delay_ms=backoff_min_delay_ms,
            bucket=bucket,
            created_at=created_at,
            endpoint=endpoint,
            execution_timeout_ms=execution_timeout_ms,
            expire_at=expire_at,
            headers=headers,
            id=id,
            method=method,
            retry_at=retry_at,
            attempts=attempts,
            event=event,
            idempotency_key=idempotency_key,
            on_complete=on_complete,
            ordering_failure=ordering_failure,
            ordering_key=ordering_key,
            ordering_position=ordering_position,
            payload=payload,
            payload_base64=payload_base64,
            traceparent=traceparent,
            tracestate=tracestate,
        )

        return import_job

