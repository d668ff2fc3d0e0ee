from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast
import datetime






T = TypeVar("T", bound="EndpointHealth")



@_attrs_define
class EndpointHealth:
    """ One endpoint as a Director sees it (updated once a second).

        Attributes:
            breaker (str): `closed` (normal) or `open` (judged down: one probe at a time).
            concurrency (int): Requests in flight allowed now (after caps and pause).
            endpoint (str): The endpoint (URL without query).
            in_flight (int): Requests in flight.
            paused (bool): Paused by an endpoint control.
            ready (int): Jobs ready to be sent, waiting in its queue.
            recent_attempts (int): Attempts remembered by the breaker, and how many of them failed.
            recent_failures (int): Failed among `recent_attempts`.
            max_per_second (float | None | Unset): A rate cap, if any.
            oldest_created_at (datetime.datetime | None | Unset): When the oldest job at the head of one of its queues was
                created.
            park_reason (None | str | Unset): Why it was parked, if it is.
            parked_since (datetime.datetime | None | Unset): Parked since (its jobs wait, one probe now and then), if it is
                parked.
            redrive_eta_secs (float | None | Unset): Seconds its ready jobs take at the re-drive's pace, if it is paced.
            redrive_per_second (float | None | Unset): Requests per second allowed by the pace of its re-drive, if it was
                unparked lately.
     """

    breaker: str
    concurrency: int
    endpoint: str
    in_flight: int
    paused: bool
    ready: int
    recent_attempts: int
    recent_failures: int
    max_per_second: float | None | Unset = UNSET
    oldest_created_at: datetime.datetime | None | Unset = UNSET
    park_reason: None | str | Unset = UNSET
    parked_since: datetime.datetime | None | Unset = UNSET
    redrive_eta_secs: float | None | Unset = UNSET
    redrive_per_second: float | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        breaker = self.breaker

        concurrency = self.concurrency

        endpoint = self.endpoint

        in_flight = self.in_flight

        paused = self.paused

        ready = self.ready

        recent_attempts = self.recent_attempts

        recent_failures = self.recent_failures

        max_per_second: float | None | Unset
        if isinstance(self.max_per_second, Unset):
            max_per_second = UNSET
        else:
            max_per_second = self.max_per_second

        oldest_created_at: None | str | Unset
        if isinstance(self.oldest_created_at, Unset):
            oldest_created_at = UNSET
        elif isinstance(self.oldest_created_at, datetime.datetime):
            oldest_created_at = self.oldest_created_at.isoformat()
        else:
            oldest_created_at = self.oldest_created_at

        park_reason: None | str | Unset
        if isinstance(self.park_reason, Unset):
            park_reason = UNSET
        else:
            park_reason = self.park_reason

        parked_since: None | str | Unset
        if isinstance(self.parked_since, Unset):
            parked_since = UNSET
        elif isinstance(self.parked_since, datetime.datetime):
            parked_since = self.parked_since.isoformat()
        else:
            parked_since = self.parked_since

        redrive_eta_secs: float | None | Unset
        if isinstance(self.redrive_eta_secs, Unset):
            redrive_eta_secs = UNSET
        else:
            redrive_eta_secs = self.redrive_eta_secs

        redrive_per_second: float | None | Unset
        if isinstance(self.redrive_per_second, Unset):
            redrive_per_second = UNSET
        else:
            redrive_per_second = self.redrive_per_second


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "breaker": breaker,
            "concurrency": concurrency,
            "endpoint": endpoint,
            "in_flight": in_flight,
            "paused": paused,
            "ready": ready,
            "recent_attempts": recent_attempts,
            "recent_failures": recent_failures,
        })
        if max_per_second is not UNSET:
            field_dict["max_per_second"] = max_per_second
        if oldest_created_at is not UNSET:
            field_dict["oldest_created_at"] = oldest_created_at
        if park_reason is not UNSET:
            field_dict["park_reason"] = park_reason
        if parked_since is not UNSET:
            field_dict["parked_since"] = parked_since
        if redrive_eta_secs is not UNSET:
            field_dict["redrive_eta_secs"] = redrive_eta_secs
        if redrive_per_second is not UNSET:
            field_dict["redrive_per_second"] = redrive_per_second

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        breaker = d.pop("breaker")

        concurrency = d.pop("concurrency")

        endpoint = d.pop("endpoint")

        in_flight = d.pop("in_flight")

        paused = d.pop("paused")

        ready = d.pop("ready")

        recent_attempts = d.pop("recent_attempts")

        recent_failures = d.pop("recent_failures")

        def _parse_max_per_second(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        max_per_second = _parse_max_per_second(d.pop("max_per_second", UNSET))


        def _parse_oldest_created_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                oldest_created_at_type_0 = datetime.datetime.fromisoformat(data)



                return oldest_created_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        oldest_created_at = _parse_oldest_created_at(d.pop("oldest_created_at", UNSET))


        def _parse_park_reason(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        park_reason = _parse_park_reason(d.pop("park_reason", UNSET))


        def _parse_parked_since(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                parked_since_type_0 = datetime.datetime.fromisoformat(data)



                return parked_since_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        parked_since = _parse_parked_since(d.pop("parked_since", UNSET))


        def _parse_redrive_eta_secs(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        redrive_eta_secs = _parse_redrive_eta_secs(d.pop("redrive_eta_secs", UNSET))


        def _parse_redrive_per_second(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        redrive_per_second = _parse_redrive_per_second(d.pop("redrive_per_second", UNSET))


        endpoint_health = cls(
            breaker=breaker,
            concurrency=concurrency,
            endpoint=endpoint,
            in_flight=in_flight,
            paused=paused,
            ready=ready,
            recent_attempts=recent_attempts,
            recent_failures=recent_failures,
            max_per_second=max_per_second,
            oldest_created_at=oldest_created_at,
            park_reason=park_reason,
            parked_since=parked_since,
            redrive_eta_secs=redrive_eta_secs,
            redrive_per_second=redrive_per_second,
        )


        endpoint_health.additional_properties = d
        return endpoint_health

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
