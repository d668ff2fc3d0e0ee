from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from typing import cast

if TYPE_CHECKING:
  from ..models.endpoint_health import EndpointHealth





T = TypeVar("T", bound="EndpointsView")



@_attrs_define
class EndpointsView:
    """ `GET /v1/endpoints` answer: the health of every endpoint this Director is working for.

        Attributes:
            endpoints (list[EndpointHealth]): One entry per endpoint with jobs queued or in flight, or a breaker that
                remembers it.
     """

    endpoints: list[EndpointHealth]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.endpoint_health import EndpointHealth # noqa: PLC0415
        endpoints = []
        for endpoints_item_data in self.endpoints:
            endpoints_item = endpoints_item_data.to_dict()
            endpoints.append(endpoints_item)




        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "endpoints": endpoints,
        })

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.endpoint_health import EndpointHealth # noqa: PLC0415
        d = dict(src_dict)
        endpoints = []
        _endpoints = d.pop("endpoints")
        for endpoints_item_data in (_endpoints):
            endpoints_item = EndpointHealth.from_dict(endpoints_item_data)



            endpoints.append(endpoints_item)


        endpoints_view = cls(
            endpoints=endpoints,
        )


        endpoints_view.additional_properties = d
        return endpoints_view

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
