from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset







T = TypeVar("T", bound="PayloadFilter")



@_attrs_define
class PayloadFilter:
    """ A payload filter: the value at a JSON pointer (RFC 6901) must equal `equals`.

        Attributes:
            equals (Any): The value it must have.
            pointer (str): Where in the payload (`/customer/tier`; `""` is the whole payload).
     """

    equals: Any
    pointer: str





    def to_dict(self) -> dict[str, Any]:
        equals = self.equals

        pointer = self.pointer


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "equals": equals,
            "pointer": pointer,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        equals = d.pop("equals")

        pointer = d.pop("pointer")

        payload_filter = cls(
            equals=equals,
            pointer=pointer,
        )

        return payload_filter

