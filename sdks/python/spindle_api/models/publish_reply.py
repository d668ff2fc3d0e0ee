from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast

if TYPE_CHECKING:
  from ..models.event_delivery import EventDelivery





T = TypeVar("T", bound="PublishReply")



@_attrs_define
class PublishReply:
    """ `POST /v1/events` answer: the event and, per matching subscription, its job. The event and
    every job were committed in one transaction before this answer; an event that matched no
    subscription is kept all the same (a subscription added later can be back-filled with it).

        Attributes:
            deliveries (list[EventDelivery]): One job per matching subscription.
            duplicate (bool | Unset): Through a router: the idempotency key was published before, within the dedup window.
                `event_id` is that event's, `deliveries` its jobs (when a Director could tell them),
                and nothing new was stored.
            event_id (None | str | Unset): The event's id (a ULID). Always given by this release; optional on the wire for
                servers that stored nothing for an event that matched no subscription.
            transaction_id (None | str | Unset): The JobDB transaction that stored it (absent through a router, and from
                servers that
                stored nothing for an event that matched no subscription).
     """

    deliveries: list[EventDelivery]
    duplicate: bool | Unset = UNSET
    event_id: None | str | Unset = UNSET
    transaction_id: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.event_delivery import EventDelivery # noqa: PLC0415
        deliveries = []
        for deliveries_item_data in self.deliveries:
            deliveries_item = deliveries_item_data.to_dict()
            deliveries.append(deliveries_item)



        duplicate = self.duplicate

        event_id: None | str | Unset
        if isinstance(self.event_id, Unset):
            event_id = UNSET
        else:
            event_id = self.event_id

        transaction_id: None | str | Unset
        if isinstance(self.transaction_id, Unset):
            transaction_id = UNSET
        else:
            transaction_id = self.transaction_id


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "deliveries": deliveries,
        })
        if duplicate is not UNSET:
            field_dict["duplicate"] = duplicate
        if event_id is not UNSET:
            field_dict["event_id"] = event_id
        if transaction_id is not UNSET:
            field_dict["transaction_id"] = transaction_id

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.event_delivery import EventDelivery # noqa: PLC0415
        d = dict(src_dict)
        deliveries = []
        _deliveries = d.pop("deliveries")
        for deliveries_item_data in (_deliveries):
            deliveries_item = EventDelivery.from_dict(deliveries_item_data)



            deliveries.append(deliveries_item)


        duplicate = d.pop("duplicate", UNSET)

        def _parse_event_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        event_id = _parse_event_id(d.pop("event_id", UNSET))


        def _parse_transaction_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        transaction_id = _parse_transaction_id(d.pop("transaction_id", UNSET))


        publish_reply = cls(
            deliveries=deliveries,
            duplicate=duplicate,
            event_id=event_id,
            transaction_id=transaction_id,
        )


        publish_reply.additional_properties = d
        return publish_reply

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
