from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset







T = TypeVar("T", bound="ImportResponse")



@_attrs_define
class ImportResponse:
    """ What an import did.

        Attributes:
            already_present (int): Jobs that were already there (an earlier attempt of the same import).
            imported (int): Jobs stored by this request.
            jobdb (str): The JobDB the jobs are now in.
     """

    already_present: int
    imported: int
    jobdb: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        already_present = self.already_present

        imported = self.imported

        jobdb = self.jobdb


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "already_present": already_present,
            "imported": imported,
            "jobdb": jobdb,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        already_present = d.pop("already_present")

        imported = d.pop("imported")

        jobdb = d.pop("jobdb")

        import_response = cls(
            already_present=already_present,
            imported=imported,
            jobdb=jobdb,
        )


        import_response.additional_properties = d
        return import_response

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
