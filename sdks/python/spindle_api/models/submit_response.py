from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast

if TYPE_CHECKING:
  from ..models.accepted_job import AcceptedJob





T = TypeVar("T", bound="SubmitResponse")



@_attrs_define
class SubmitResponse:
    """ `POST /v1/jobs` answer: the commit that made the jobs durable, and the jobs in request order.

        Attributes:
            jobs (list[AcceptedJob]): The accepted jobs, in request order.
            transaction_id (str): Id of the JobDB transaction that persisted the batch.
     """

    jobs: list[AcceptedJob]
    transaction_id: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.accepted_job import AcceptedJob # noqa: PLC0415
        jobs = []
        for jobs_item_data in self.jobs:
            jobs_item = jobs_item_data.to_dict()
            jobs.append(jobs_item)



        transaction_id = self.transaction_id


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "jobs": jobs,
            "transaction_id": transaction_id,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.accepted_job import AcceptedJob # noqa: PLC0415
        d = dict(src_dict)
        jobs = []
        _jobs = d.pop("jobs")
        for jobs_item_data in (_jobs):
            jobs_item = AcceptedJob.from_dict(jobs_item_data)



            jobs.append(jobs_item)


        transaction_id = d.pop("transaction_id")

        submit_response = cls(
            jobs=jobs,
            transaction_id=transaction_id,
        )


        submit_response.additional_properties = d
        return submit_response

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
