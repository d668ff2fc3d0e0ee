from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast

if TYPE_CHECKING:
  from ..models.past_event import PastEvent





T = TypeVar("T", bound="BackfillRequest")



@_attrs_define
class BackfillRequest:
    """ `POST /v1/subscriptions/{id}/backfill` body: past events to deliver to one subscription
    (added after they were published), as a back-fill reads them from a JobDB or the archive.

        Attributes:
            events (list[PastEvent]): 1 to 1000 events of the subscription's bucket; those its types or filter do not want,
                and those it already has a job for in this Director's JobDB, are skipped.
     """

    events: list[PastEvent]





    def to_dict(self) -> dict[str, Any]:
        from ..models.past_event import PastEvent # noqa: PLC0415
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
        from ..models.past_event import PastEvent # noqa: PLC0415
        d = dict(src_dict)
        events = []
        _events = d.pop("events")
        for events_item_data in (_events):
            events_item = PastEvent.from_dict(events_item_data)



            events.append(events_item)


        backfill_request = cls(
            events=events,
        )

        return backfill_request

