from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..models.job_status import JobStatus
from ..types import UNSET, Unset
from typing import cast
import datetime






T = TypeVar("T", bound="AcceptedJob")



@_attrs_define
class AcceptedJob:
    """ One job of a submission's answer.

        Attributes:
            bucket (str): The bucket given.
            id (str): The job id (ULID): this job's, or for a duplicate the original job's.
            created_at (datetime.datetime | None | Unset): When the job was accepted (for `accepted`).
            deliver_at (datetime.datetime | None | Unset): For an `accepted` job scheduled with `deliver_at` or `delay_ms`:
                its first attempt's
                time.
            error (None | str | Unset): For `pending` and `failed`: why.
            expire_at (datetime.datetime | None | Unset): When it stops being retried (for `accepted`).
            idempotency_key (None | str | Unset): The idempotency key given, if any.
            status (JobStatus | Unset): What became of one job of a submission. A Director answers `accepted` for every job
                of a
                202; a router also answers `duplicate`, `pending` and `failed`.
     """

    bucket: str
    id: str
    created_at: datetime.datetime | None | Unset = UNSET
    deliver_at: datetime.datetime | None | Unset = UNSET
    error: None | str | Unset = UNSET
    expire_at: datetime.datetime | None | Unset = UNSET
    idempotency_key: None | str | Unset = UNSET
    status: JobStatus | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        bucket = self.bucket

        id = self.id

        created_at: None | str | Unset
        if isinstance(self.created_at, Unset):
            created_at = UNSET
        elif isinstance(self.created_at, datetime.datetime):
            created_at = self.created_at.isoformat()
        else:
            created_at = self.created_at

        deliver_at: None | str | Unset
        if isinstance(self.deliver_at, Unset):
            deliver_at = UNSET
        elif isinstance(self.deliver_at, datetime.datetime):
            deliver_at = self.deliver_at.isoformat()
        else:
            deliver_at = self.deliver_at

        error: None | str | Unset
        if isinstance(self.error, Unset):
            error = UNSET
        else:
            error = self.error

        expire_at: None | str | Unset
        if isinstance(self.expire_at, Unset):
            expire_at = UNSET
        elif isinstance(self.expire_at, datetime.datetime):
            expire_at = self.expire_at.isoformat()
        else:
            expire_at = self.expire_at

        idempotency_key: None | str | Unset
        if isinstance(self.idempotency_key, Unset):
            idempotency_key = UNSET
        else:
            idempotency_key = self.idempotency_key

        status: str | Unset = UNSET
        if not isinstance(self.status, Unset):
            status = self.status.value



        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "bucket": bucket,
            "id": id,
        })
        if created_at is not UNSET:
            field_dict["created_at"] = created_at
        if deliver_at is not UNSET:
            field_dict["deliver_at"] = deliver_at
        if error is not UNSET:
            field_dict["error"] = error
        if expire_at is not UNSET:
            field_dict["expire_at"] = expire_at
        if idempotency_key is not UNSET:
            field_dict["idempotency_key"] = idempotency_key
        if status is not UNSET:
            field_dict["status"] = status

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        bucket = d.pop("bucket")

        id = d.pop("id")

        def _parse_created_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                created_at_type_0 = datetime.datetime.fromisoformat(data)



                return created_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        created_at = _parse_created_at(d.pop("created_at", UNSET))


        def _parse_deliver_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                deliver_at_type_0 = datetime.datetime.fromisoformat(data)



                return deliver_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        deliver_at = _parse_deliver_at(d.pop("deliver_at", UNSET))


        def _parse_error(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        error = _parse_error(d.pop("error", UNSET))


        def _parse_expire_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                expire_at_type_0 = datetime.datetime.fromisoformat(data)



                return expire_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        expire_at = _parse_expire_at(d.pop("expire_at", UNSET))


        def _parse_idempotency_key(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        idempotency_key = _parse_idempotency_key(d.pop("idempotency_key", UNSET))


        _status = d.pop("status", UNSET)
        status: JobStatus | Unset
        if isinstance(_status,  Unset):
            status = UNSET
        else:
            status = JobStatus(_status)




        accepted_job = cls(
            bucket=bucket,
            id=id,
            created_at=created_at,
            deliver_at=deliver_at,
            error=error,
            expire_at=expire_at,
            idempotency_key=idempotency_key,
            status=status,
        )


        accepted_job.additional_properties = d
        return accepted_job

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
