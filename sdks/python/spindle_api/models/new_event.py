from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast
import datetime






T = TypeVar("T", bound="NewEvent")



@_attrs_define
class NewEvent:
    """ `POST /v1/events` body: one event of a bucket, delivered to every matching subscription.

        Attributes:
            bucket (str): The bucket (tenant) it belongs to.
            event_type (str): Its type: dot-separated names of letters, digits, `_` and `-` (at most 255 bytes).
            payload (Any): Its data, any JSON value: subscribers get `{"type", "timestamp", "data"}`.
            deliver_at (datetime.datetime | None | Unset): When to make the first attempts (RFC 3339).
            idempotency_key (None | str | Unset): The producer's idempotency key: a repeated key (through a router) stores
                nothing new.
            on_complete (None | str | Unset): A URL told when each of its jobs ends.
            traceparent (None | str | Unset): The W3C trace context of the producer's span, for an event of a batch made in
                a trace
                of its own; otherwise the request's `traceparent` header applies (see
                [`crate::NewJob::traceparent`]).
            tracestate (None | str | Unset): The `tracestate` that goes with `traceparent`.
     """

    bucket: str
    event_type: str
    payload: Any
    deliver_at: datetime.datetime | None | Unset = UNSET
    idempotency_key: None | str | Unset = UNSET
    on_complete: None | str | Unset = UNSET
    traceparent: None | str | Unset = UNSET
    tracestate: None | str | Unset = UNSET





    def to_dict(self) -> dict[str, Any]:
        bucket = self.bucket

        event_type = self.event_type

        payload = self.payload

        deliver_at: None | str | Unset
        if isinstance(self.deliver_at, Unset):
            deliver_at = UNSET
        elif isinstance(self.deliver_at, datetime.datetime):
            deliver_at = self.deliver_at.isoformat()
        else:
            deliver_at = self.deliver_at

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
            "bucket": bucket,
            "event_type": event_type,
            "payload": payload,
        })
        if deliver_at is not UNSET:
            field_dict["deliver_at"] = deliver_at
        if idempotency_key is not UNSET:
            field_dict["idempotency_key"] = idempotency_key
        if on_complete is not UNSET:
            field_dict["on_complete"] = on_complete
        if traceparent is not UNSET:
            field_dict["traceparent"] = traceparent
        if tracestate is not UNSET:
            field_dict["tracestate"] = tracestate

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        bucket = d.pop("bucket")

        event_type = d.pop("event_type")

        payload = d.pop("payload")

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


        new_event = cls(
            bucket=bucket,
            event_type=event_type,
            payload=payload,
            deliver_at=deliver_at,
            idempotency_key=idempotency_key,
            on_complete=on_complete,
            traceparent=traceparent,
            tracestate=tracestate,
        )

        return new_event

