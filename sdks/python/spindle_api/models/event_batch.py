from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast

if TYPE_CHECKING:
  from ..models.new_event import NewEvent





T = TypeVar("T", bound="EventBatch")



@_attrs_define
class EventBatch:
    """ `POST /v1/events` body for a batch: 1 to [`MAX_EVENTS_PER_REQUEST`] events, whose jobs are
    all committed in one transaction, or none of them.

        Attributes:
            events (list[NewEvent]): The events, each as `POST /v1/events` takes one.
     """

    events: list[NewEvent]





    def to_dict(self) -> dict[str, Any]:
        from ..models.new_event import NewEvent # noqa: PLC0415
        events = []
        for events_item_data in self.events:
            events_item = events_item_data.to_dict()
            events.append(events_item)




        field_dict: dict[str, Any] = {}

        field_dict.update({
            "events": events,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.new_event import NewEvent # noqa: PLC0415
        d = dict(src_dict)
        events = []
        _events = d.pop("events")
        for events_item_data in (_events):
            events_item = NewEvent.from_dict(events_item_data)



            events.append(events_item)


        event_batch = cls(
            events=events,
        )

        return event_batch

