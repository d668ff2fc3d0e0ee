from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset







T = TypeVar("T", bound="EventLink")



@_attrs_define
class EventLink:
    """ Which event a job delivers, and for which subscription.

        Attributes:
            event_id (str): The event's id (a ULID).
            event_type (str): The event's type.
            subscription_id (str): The subscription's id (a ULID).
     """

    event_id: str
    event_type: str
    subscription_id: str





    def to_dict(self) -> dict[str, Any]:
        event_id = self.event_id

        event_type = self.event_type

        subscription_id = self.subscription_id


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "event_id": event_id,
            "event_type": event_type,
            "subscription_id": subscription_id,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        event_id = d.pop("event_id")

        event_type = d.pop("event_type")

        subscription_id = d.pop("subscription_id")

        event_link = cls(
            event_id=event_id,
            event_type=event_type,
            subscription_id=subscription_id,
        )

        return event_link

