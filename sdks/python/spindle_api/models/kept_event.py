from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast
import datetime

if TYPE_CHECKING:
  from ..models.kept_event_envelope import KeptEventEnvelope





T = TypeVar("T", bound="KeptEvent")



@_attrs_define
class KeptEvent:
    """ An event published without a job (it matched no subscription), kept with its envelope so a
    subscription added later can be back-filled with it.

        Attributes:
            bucket (str): Its bucket.
            created_at (datetime.datetime): When it was published.
            envelope (KeptEventEnvelope): Its envelope, `{"type", "timestamp", "data"}`, as a job of it would carry it.
            event_id (str): The event's id (a ULID).
            event_type (str): Its type.
     """

    bucket: str
    created_at: datetime.datetime
    envelope: KeptEventEnvelope
    event_id: str
    event_type: str





    def to_dict(self) -> dict[str, Any]:
        from ..models.kept_event_envelope import KeptEventEnvelope # noqa: PLC0415
        bucket = self.bucket

        created_at = self.created_at.isoformat()

        envelope = self.envelope.to_dict()

        event_id = self.event_id

        event_type = self.event_type


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "bucket": bucket,
            "created_at": created_at,
            "envelope": envelope,
            "event_id": event_id,
            "event_type": event_type,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.kept_event_envelope import KeptEventEnvelope # noqa: PLC0415
        d = dict(src_dict)
        bucket = d.pop("bucket")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))




        envelope = KeptEventEnvelope.from_dict(d.pop("envelope"))




        event_id = d.pop("event_id")

        event_type = d.pop("event_type")

        kept_event = cls(
            bucket=bucket,
            created_at=created_at,
            envelope=envelope,
            event_id=event_id,
            event_type=event_type,
        )

        return kept_event

