from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast
import datetime






T = TypeVar("T", bound="BlockedKey")



@_attrs_define
class BlockedKey:
    """ An ordered key stopped by a job that ended without success and asked to block it; it stays
    stopped until an operator deletes its `ordering_blocked` row.

        Attributes:
            blocked_at (datetime.datetime): When it blocked the key.
            bucket (str): The key's bucket.
            endpoint (str): The key's endpoint URL.
            job_id (str): The job whose end blocked it (ULID).
            ordering_key (str): The ordering key.
            state (str): How that job ended (`discarded`, `archiving`).
     """

    blocked_at: datetime.datetime
    bucket: str
    endpoint: str
    job_id: str
    ordering_key: str
    state: str





    def to_dict(self) -> dict[str, Any]:
        blocked_at = self.blocked_at.isoformat()

        bucket = self.bucket

        endpoint = self.endpoint

        job_id = self.job_id

        ordering_key = self.ordering_key

        state = self.state


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "blocked_at": blocked_at,
            "bucket": bucket,
            "endpoint": endpoint,
            "job_id": job_id,
            "ordering_key": ordering_key,
            "state": state,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        blocked_at = datetime.datetime.fromisoformat(d.pop("blocked_at"))




        bucket = d.pop("bucket")

        endpoint = d.pop("endpoint")

        job_id = d.pop("job_id")

        ordering_key = d.pop("ordering_key")

        state = d.pop("state")

        blocked_key = cls(
            blocked_at=blocked_at,
            bucket=bucket,
            endpoint=endpoint,
            job_id=job_id,
            ordering_key=ordering_key,
            state=state,
        )

        return blocked_key

