from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..models.ordering_failure import OrderingFailure
from ..types import UNSET, Unset
from typing import cast

if TYPE_CHECKING:
  from ..models.new_subscription_headers_type_0 import NewSubscriptionHeadersType0
  from ..models.payload_filter import PayloadFilter





T = TypeVar("T", bound="NewSubscription")



@_attrs_define
class NewSubscription:
    """ `POST /v1/subscriptions` body: who gets which events of a bucket, and how.

        Attributes:
            bucket (str): The bucket (tenant) whose events it receives (1–128 characters).
            event_types (list[str]): Event types it wants (1 to 64): exact names (`invoice.paid`), prefix wildcards
                (`invoice.*`) or `*` for every type.
            url (str): The http or https URL events are delivered to (at most 2048 bytes; not in a blocked
                address range).
            backoff_coefficient (float | None | Unset): Growth of the delay per attempt (as a job's `backoff_coefficient`).
            backoff_min_delay_ms (int | None | Unset): Delay before the second attempt in ms (as a job's
                `backoff_min_delay_ms`).
            description (None | str | Unset): Free text for operators (at most 256 characters).
            enabled (bool | None | Unset): Whether it receives events now (default true). A disabled subscription still gets
                its jobs; they wait until it is enabled again (or expire).
            execution_timeout_ms (int | None | Unset): Deadline of one attempt in ms (as a job's `execution_timeout_ms`).
            filter_ (None | PayloadFilter | Unset):
            headers (NewSubscriptionHeadersType0 | None | Unset): Extra request headers (at most 64).
            max_concurrency (int | None | Unset): Most requests to its URL in flight at once, per Director (1 to 10,000).
                Its URL's
                endpoint control in Consul, when lower, still rules.
            max_per_second (float | None | Unset): Most requests to its URL started per second, per Director (above 0, at
                most
                1,000,000).
            ordering_failure (None | OrderingFailure | Unset):
            ordering_key (None | str | Unset): A JSON pointer into the payload whose value (a string or number) orders the
                events
                sent to it: events with the same value arrive one at a time, in publish order.
            secret (None | str | Unset): Its Standard Webhooks signing secret (`whsec_` + base64 of 24–64 bytes); one is
                made
                when absent and shown once, in the answer.
            send_traceparent (bool | None | Unset): Whether its receiver gets a W3C `traceparent` header naming the
                attempt's span, so
                the receiver's trace continues it (default true).
            ttl_ms (int | None | Unset): How long an event is retried for it, in ms (as a job's `ttl_ms`).
     """

    bucket: str
    event_types: list[str]
    url: str
    backoff_coefficient: float | None | Unset = UNSET
    backoff_min_delay_ms: int | None | Unset = UNSET
    description: None | str | Unset = UNSET
    enabled: bool | None | Unset = UNSET
    execution_timeout_ms: int | None | Unset = UNSET
    filter_: None | PayloadFilter | Unset = UNSET
    headers: NewSubscriptionHeadersType0 | None | Unset = UNSET
    max_concurrency: int | None | Unset = UNSET
    max_per_second: float | None | Unset = UNSET
    ordering_failure: None | OrderingFailure | Unset = UNSET
    ordering_key: None | str | Unset = UNSET
    secret: None | str | Unset = UNSET
    send_traceparent: bool | None | Unset = UNSET
    ttl_ms: int | None | Unset = UNSET





    def to_dict(self) -> dict[str, Any]:
        from ..models.new_subscription_headers_type_0 import NewSubscriptionHeadersType0 # noqa: PLC0415
        from ..models.payload_filter import PayloadFilter # noqa: PLC0415
        bucket = self.bucket

        event_types = self.event_types



        url = self.url

        backoff_coefficient: float | None | Unset
        if isinstance(self.backoff_coefficient, Unset):
            backoff_coefficient = UNSET
        else:
            backoff_coefficient = self.backoff_coefficient

        backoff_min_delay_ms: int | None | Unset
        if isinstance(self.backoff_min_delay_ms, Unset):
            backoff_min_delay_ms = UNSET
        else:
            backoff_min_delay_ms = self.backoff_min_delay_ms

        description: None | str | Unset
        if isinstance(self.description, Unset):
            description = UNSET
        else:
            description = self.description

        enabled: bool | None | Unset
        if isinstance(self.enabled, Unset):
            enabled = UNSET
        else:
            enabled = self.enabled

        execution_timeout_ms: int | None | Unset
        if isinstance(self.execution_timeout_ms, Unset):
            execution_timeout_ms = UNSET
        else:
            execution_timeout_ms = self.execution_timeout_ms

        filter_: dict[str, Any] | None | Unset
        if isinstance(self.filter_, Unset):
            filter_ = UNSET
        elif isinstance(self.filter_, PayloadFilter):
            filter_ = self.filter_.to_dict()
        else:
            filter_ = self.filter_

        headers: dict[str, Any] | None | Unset
        if isinstance(self.headers, Unset):
            headers = UNSET
        elif isinstance(self.headers, NewSubscriptionHeadersType0):
            headers = self.headers.to_dict()
        else:
            headers = self.headers

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

        ordering_failure: None | str | Unset
        if isinstance(self.ordering_failure, Unset):
            ordering_failure = UNSET
        elif isinstance(self.ordering_failure, OrderingFailure):
            ordering_failure = self.ordering_failure.value
        else:
            ordering_failure = self.ordering_failure

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

        send_traceparent: bool | None | Unset
        if isinstance(self.send_traceparent, Unset):
            send_traceparent = UNSET
        else:
            send_traceparent = self.send_traceparent

        ttl_ms: int | None | Unset
        if isinstance(self.ttl_ms, Unset):
            ttl_ms = UNSET
        else:
            ttl_ms = self.ttl_ms


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "bucket": bucket,
            "event_types": event_types,
            "url": url,
        })
        if backoff_coefficient is not UNSET:
            field_dict["backoff_coefficient"] = backoff_coefficient
        if backoff_min_delay_ms is not UNSET:
            field_dict["backoff_min_delay_ms"] = backoff_min_delay_ms
        if description is not UNSET:
            field_dict["description"] = description
        if enabled is not UNSET:
            field_dict["enabled"] = enabled
        if execution_timeout_ms is not UNSET:
            field_dict["execution_timeout_ms"] = execution_timeout_ms
        if filter_ is not UNSET:
            field_dict["filter"] = filter_
        if headers is not UNSET:
            field_dict["headers"] = headers
        if max_concurrency is not UNSET:
            field_dict["max_concurrency"] = max_concurrency
        if max_per_second is not UNSET:
            field_dict["max_per_second"] = max_per_second
        if ordering_failure is not UNSET:
            field_dict["ordering_failure"] = ordering_failure
        if ordering_key is not UNSET:
            field_dict["ordering_key"] = ordering_key
        if secret is not UNSET:
            field_dict["secret"] = secret
        if send_traceparent is not UNSET:
            field_dict["send_traceparent"] = send_traceparent
        if ttl_ms is not UNSET:
            field_dict["ttl_ms"] = ttl_ms

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.new_subscription_headers_type_0 import NewSubscriptionHeadersType0 # noqa: PLC0415
        from ..models.payload_filter import PayloadFilter # noqa: PLC0415
        d = dict(src_dict)
        bucket = d.pop("bucket")

        event_types = cast(list[str], d.pop("event_types"))


        url = d.pop("url")

        def _parse_backoff_coefficient(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        backoff_coefficient = _parse_backoff_coefficient(d.pop("backoff_coefficient", UNSET))


        def _parse_backoff_min_delay_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        backoff_min_delay_ms = _parse_backoff_min_delay_ms(d.pop("backoff_min_delay_ms", UNSET))


        def _parse_description(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        description = _parse_description(d.pop("description", UNSET))


        def _parse_enabled(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        enabled = _parse_enabled(d.pop("enabled", UNSET))


        def _parse_execution_timeout_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        execution_timeout_ms = _parse_execution_timeout_ms(d.pop("execution_timeout_ms", UNSET))


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


        def _parse_headers(data: object) -> NewSubscriptionHeadersType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                headers_type_0 = NewSubscriptionHeadersType0.from_dict(data)



                return headers_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(NewSubscriptionHeadersType0 | None | Unset, data)

        headers = _parse_headers(d.pop("headers", UNSET))


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


        def _parse_ordering_failure(data: object) -> None | OrderingFailure | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                ordering_failure_type_1 = OrderingFailure(data)



                return ordering_failure_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | OrderingFailure | Unset, data)

        ordering_failure = _parse_ordering_failure(d.pop("ordering_failure", UNSET))


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


        def _parse_send_traceparent(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        send_traceparent = _parse_send_traceparent(d.pop("send_traceparent", UNSET))


        def _parse_ttl_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        ttl_ms = _parse_ttl_ms(d.pop("ttl_ms", UNSET))


        new_subscription = cls(
            bucket=bucket,
            event_types=event_types,
            url=url,
            backoff_coefficient=backoff_coefficient,
            backoff_min_delay_ms=backoff_min_delay_ms,
            description=description,
            enabled=enabled,
            execution_timeout_ms=execution_timeout_ms,
            filter_=filter_,
            headers=headers,
            max_concurrency=max_concurrency,
            max_per_second=max_per_second,
            ordering_failure=ordering_failure,
            ordering_key=ordering_key,
            secret=secret,
            send_traceparent=send_traceparent,
            ttl_ms=ttl_ms,
        )

        return new_subscription

