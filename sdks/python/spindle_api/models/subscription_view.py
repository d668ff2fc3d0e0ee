from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast
import datetime

if TYPE_CHECKING:
  from ..models.payload_filter import PayloadFilter
  from ..models.subscription_view_headers import SubscriptionViewHeaders





T = TypeVar("T", bound="SubscriptionView")



@_attrs_define
class SubscriptionView:
    """ A stored subscription, as the API shows it (its secret only in the answer that made it).

        Attributes:
            bucket (str): Its bucket.
            created_at (datetime.datetime): When it was made.
            enabled (bool): Whether events go out now.
            event_types (list[str]): The event types it wants.
            id (str): Its id (a ULID).
            updated_at (datetime.datetime): When it last changed.
            url (str): Where events go.
            description (None | str | Unset): Its description.
            filter_ (None | PayloadFilter | Unset):
            headers (SubscriptionViewHeaders | Unset): Its extra headers.
            max_concurrency (int | None | Unset): Its cap on requests in flight, per Director.
            max_per_second (float | None | Unset): Its cap on requests started per second, per Director.
            ordering_key (None | str | Unset): Its ordering key pointer.
            secret (None | str | Unset): Its signing secret: only in the answer to `POST /v1/subscriptions`.
            send_traceparent (bool | Unset): Whether its receiver gets a `traceparent` header.
            version (int | Unset): The version of its last change: give it as `If-Match` to a `PATCH` so that the edit
                holds only if nobody changed it since (its answer's `ETag` too), from the answer that
                made it on.
     """

    bucket: str
    created_at: datetime.datetime
    enabled: bool
    event_types: list[str]
    id: str
    updated_at: datetime.datetime
    url: str
    description: None | str | Unset = UNSET
    filter_: None | PayloadFilter | Unset = UNSET
    headers: SubscriptionViewHeaders | Unset = UNSET
    max_concurrency: int | None | Unset = UNSET
    max_per_second: float | None | Unset = UNSET
    ordering_key: None | str | Unset = UNSET
    secret: None | str | Unset = UNSET
    send_traceparent: bool | Unset = UNSET
    version: int | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        from ..models.payload_filter import PayloadFilter # noqa: PLC0415
        from ..models.subscription_view_headers import SubscriptionViewHeaders # noqa: PLC0415
        bucket = self.bucket

        created_at = self.created_at.isoformat()

        enabled = self.enabled

        event_types = self.event_types



        id = self.id

        updated_at = self.updated_at.isoformat()

        url = self.url

        description: None | str | Unset
        if isinstance(self.description, Unset):
            description = UNSET
        else:
            description = self.description

        filter_: dict[str, Any] | None | Unset
        if isinstance(self.filter_, Unset):
            filter_ = UNSET
        elif isinstance(self.filter_, PayloadFilter):
            filter_ = self.filter_.to_dict()
        else:
            filter_ = self.filter_

        headers: dict[str, Any] | Unset = UNSET
        if not isinstance(self.headers, Unset):
            headers = self.headers.to_dict()

        max_concurrency: int | None | Unset
        if isinstance(self.max_concurrency, Unset):
            max_concurrency = UNSET
        else:
            max_concurrency = self.max_concurrency

        max_per_second: float | None | Unset
        if isinstance(self.max_per_second, Unset):
            max_per_second = UNSET
        else:
            max_per_second = self.max_per_second

        ordering_key: None | str | Unset
        if isinstance(self.ordering_key, Unset):
            ordering_key = UNSET
        else:
            ordering_key = self.ordering_key

        secret: None | str | Unset
        if isinstance(self.secret, Unset):
            secret = UNSET
        else:
            secret = self.secret

        send_traceparent = self.send_traceparent

        version = self.version


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "bucket": bucket,
            "created_at": created_at,
            "enabled": enabled,
            "event_types": event_types,
            "id": id,
            "updated_at": updated_at,
            "url": url,
        })
        if description is not UNSET:
            field_dict["description"] = description
        if filter_ is not UNSET:
            field_dict["filter"] = filter_
        if headers is not UNSET:
            field_dict["headers"] = headers
        if max_concurrency is not UNSET:
            field_dict["max_concurrency"] = max_concurrency
        if max_per_second is not UNSET:
            field_dict["max_per_second"] = max_per_second
        if ordering_key is not UNSET:
            field_dict["ordering_key"] = ordering_key
        if secret is not UNSET:
            field_dict["secret"] = secret
        if send_traceparent is not UNSET:
            field_dict["send_traceparent"] = send_traceparent
        if version is not UNSET:
            field_dict["version"] = version

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.payload_filter import PayloadFilter # noqa: PLC0415
        from ..models.subscription_view_headers import SubscriptionViewHeaders # noqa: PLC0415
        d = dict(src_dict)
        bucket = d.pop("bucket")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))




        enabled = d.pop("enabled")

        event_types = cast(list[str], d.pop("event_types"))


        id = d.pop("id")

        updated_at = datetime.datetime.fromisoformat(d.pop("updated_at"))




        url = d.pop("url")

        def _parse_description(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        description = _parse_description(d.pop("description", UNSET))


        def _parse_filter_(data: object) -> None | PayloadFilter | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_1 = PayloadFilter.from_dict(data)



                return filter_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PayloadFilter | Unset, data)

        filter_ = _parse_filter_(d.pop("filter", UNSET))


        _headers = d.pop("headers", UNSET)
        headers: SubscriptionViewHeaders | Unset
        if isinstance(_headers,  Unset):
            headers = UNSET
        else:
            headers = SubscriptionViewHeaders.from_dict(_headers)




        def _parse_max_concurrency(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_concurrency = _parse_max_concurrency(d.pop("max_concurrency", UNSET))


        def _parse_max_per_second(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        max_per_second = _parse_max_per_second(d.pop("max_per_second", UNSET))


        def _parse_ordering_key(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        ordering_key = _parse_ordering_key(d.pop("ordering_key", UNSET))


        def _parse_secret(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        secret = _parse_secret(d.pop("secret", UNSET))


        send_traceparent = d.pop("send_traceparent", UNSET)

        version = d.pop("version", UNSET)

        subscription_view = cls(
            bucket=bucket,
            created_at=created_at,
            enabled=enabled,
            event_types=event_types,
            id=id,
            updated_at=updated_at,
            url=url,
            description=description,
            filter_=filter_,
            headers=headers,
            max_concurrency=max_concurrency,
            max_per_second=max_per_second,
            ordering_key=ordering_key,
            secret=secret,
            send_traceparent=send_traceparent,
            version=version,
        )


        subscription_view.additional_properties = d
        return subscription_view

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
