from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast






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
