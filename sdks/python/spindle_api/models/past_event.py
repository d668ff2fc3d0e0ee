from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast
import datetime






T = TypeVar("T", bound="PastEvent")



@_attrs_define
class PastEvent:
    """ An event as it was published: its id, type, time and data (its envelope's parts).

        Attributes:
            data (Any): Its data, any JSON value.
            event_id (str): The event's id (a ULID): the subscriber sees the same `spindle-event-id`.
            event_type (str): Its type.
            timestamp (datetime.datetime): When it was published (its envelope's `timestamp`).
     """

    data: Any
    event_id: str
    event_type: str
    timestamp: datetime.datetime





    def to_dict(self) -> dict[str, Any]:
        data = self.data

        event_id = self.event_id

        event_type = self.event_type

        timestamp = self.timestamp.isoformat()


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "data": data,
            "event_id": event_id,
            "event_type": event_type,
            "timestamp": timestamp,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        data = d.pop("data")

        event_id = d.pop("event_id")

        event_type = d.pop("event_type")

        timestamp = datetime.datetime.fromisoformat(d.pop("timestamp"))




        past_event = cls(
            data=data,
            event_id=event_id,
            event_type=event_type,
            timestamp=timestamp,
        )

        return past_event

