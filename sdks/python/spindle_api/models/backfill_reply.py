from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast

if TYPE_CHECKING:
  from ..models.backfilled_event import BackfilledEvent





T = TypeVar("T", bound="BackfillReply")



@_attrs_define
class BackfillReply:
    """ `POST /v1/subscriptions/{id}/backfill` answer: the jobs made, all committed together.

        Attributes:
            deliveries (list[BackfilledEvent]): One job per event delivered now: its `subscription_id` is the back-filled
                one.
            skipped (int): Events skipped: not wanted by the subscription, or already given a job for it here.
     """

    deliveries: list[BackfilledEvent]
    skipped: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.backfilled_event import BackfilledEvent # noqa: PLC0415
        deliveries = []
        for deliveries_item_data in self.deliveries:
            deliveries_item = deliveries_item_data.to_dict()
            deliveries.append(deliveries_item)



        skipped = self.skipped


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "deliveries": deliveries,
            "skipped": skipped,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.backfilled_event import BackfilledEvent # noqa: PLC0415
        d = dict(src_dict)
        deliveries = []
        _deliveries = d.pop("deliveries")
        for deliveries_item_data in (_deliveries):
            deliveries_item = BackfilledEvent.from_dict(deliveries_item_data)



            deliveries.append(deliveries_item)


        skipped = d.pop("skipped")

        backfill_reply = cls(
            deliveries=deliveries,
            skipped=skipped,
        )


        backfill_reply.additional_properties = d
        return backfill_reply

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
