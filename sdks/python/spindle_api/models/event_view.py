from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast
import datetime

if TYPE_CHECKING:
  from ..models.event_delivery import EventDelivery





T = TypeVar("T", bound="EventView")



@_attrs_define
class EventView:
    """ `GET /v1/events/{id}` answer: an event as the JobDB of the Director asked holds it.

        Attributes:
            bucket (str): Its bucket.
            created_at (datetime.datetime): When it was published.
            deliveries (list[EventDelivery]): Its jobs in this JobDB, one per subscription it reached, by subscription.
            event_id (str): The event's id (a ULID).
            event_type (str): Its type.
     """

    bucket: str
    created_at: datetime.datetime
    deliveries: list[EventDelivery]
    event_id: str
    event_type: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.event_delivery import EventDelivery # noqa: PLC0415
        bucket = self.bucket

        created_at = self.created_at.isoformat()

        deliveries = []
        for deliveries_item_data in self.deliveries:
            deliveries_item = deliveries_item_data.to_dict()
            deliveries.append(deliveries_item)



        event_id = self.event_id

        event_type = self.event_type


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "bucket": bucket,
            "created_at": created_at,
            "deliveries": deliveries,
            "event_id": event_id,
            "event_type": event_type,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.event_delivery import EventDelivery # noqa: PLC0415
        d = dict(src_dict)
        bucket = d.pop("bucket")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))




        deliveries = []
        _deliveries = d.pop("deliveries")
        for deliveries_item_data in (_deliveries):
            deliveries_item = EventDelivery.from_dict(deliveries_item_data)



            deliveries.append(deliveries_item)


        event_id = d.pop("event_id")

        event_type = d.pop("event_type")

        event_view = cls(
            bucket=bucket,
            created_at=created_at,
            deliveries=deliveries,
            event_id=event_id,
            event_type=event_type,
        )


        event_view.additional_properties = d
        return event_view

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
