from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast
import datetime






T = TypeVar("T", bound="TransitionView")



@_attrs_define
class TransitionView:
    """ One row of a job's trace.

        Attributes:
            attempts (int): Attempts started so far.
            id (int): Monotonic row id within the JobDB.
            state (str): State entered. Example: awaiting-retry.
            time (datetime.datetime): When the state was entered.
            duration_ms (int | None | Unset): Duration of the attempt.
            error_response (None | str | Unset): Start of the failed answer (text, or base64 when `error_response_encoding`
                is `base64`).
            error_response_encoding (None | str | Unset): `utf-8` or `base64`.
            error_type (None | str | Unset): Failure kind.
            response_status (int | None | Unset): HTTP status of the attempt.
            retry_at (datetime.datetime | None | Unset): When the next attempt is due (awaiting-retry).
     """

    attempts: int
    id: int
    state: str
    time: datetime.datetime
    duration_ms: int | None | Unset = UNSET
    error_response: None | str | Unset = UNSET
    error_response_encoding: None | str | Unset = UNSET
    error_type: None | str | Unset = UNSET
    response_status: int | None | Unset = UNSET
    retry_at: datetime.datetime | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        attempts = self.attempts

        id = self.id

        state = self.state

        time = self.time.isoformat()

        duration_ms: int | None | Unset
        if isinstance(self.duration_ms, Unset):
            duration_ms = UNSET
        else:
            duration_ms = self.duration_ms

        error_response: None | str | Unset
        if isinstance(self.error_response, Unset):
            error_response = UNSET
        else:
            error_response = self.error_response

        error_response_encoding: None | str | Unset
        if isinstance(self.error_response_encoding, Unset):
            error_response_encoding = UNSET
        else:
            error_response_encoding = self.error_response_encoding

        error_type: None | str | Unset
        if isinstance(self.error_type, Unset):
            error_type = UNSET
        else:
            error_type = self.error_type

        response_status: int | None | Unset
        if isinstance(self.response_status, Unset):
            response_status = UNSET
        else:
            response_status = self.response_status

        retry_at: None | str | Unset
        if isinstance(self.retry_at, Unset):
            retry_at = UNSET
        elif isinstance(self.retry_at, datetime.datetime):
            retry_at = self.retry_at.isoformat()
        else:
            retry_at = self.retry_at


        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({
            "attempts": attempts,
            "id": id,
            "state": state,
            "time": time,
        })
        if duration_ms is not UNSET:
            field_dict["duration_ms"] = duration_ms
        if error_response is not UNSET:
            field_dict["error_response"] = error_response
        if error_response_encoding is not UNSET:
            field_dict["error_response_encoding"] = error_response_encoding
        if error_type is not UNSET:
            field_dict["error_type"] = error_type
        if response_status is not UNSET:
            field_dict["response_status"] = response_status
        if retry_at is not UNSET:
            field_dict["retry_at"] = retry_at

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        attempts = d.pop("attempts")

        id = d.pop("id")

        state = d.pop("state")

        time = datetime.datetime.fromisoformat(d.pop("time"))




        def _parse_duration_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        duration_ms = _parse_duration_ms(d.pop("duration_ms", UNSET))


        def _parse_error_response(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        error_response = _parse_error_response(d.pop("error_response", UNSET))


        def _parse_error_response_encoding(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        error_response_encoding = _parse_error_response_encoding(d.pop("error_response_encoding", UNSET))


        def _parse_error_type(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        error_type = _parse_error_type(d.pop("error_type", UNSET))


        def _parse_response_status(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        response_status = _parse_response_status(d.pop("response_status", UNSET))


        def _parse_retry_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                retry_at_type_0 = datetime.datetime.fromisoformat(data)



                return retry_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        retry_at = _parse_retry_at(d.pop("retry_at", UNSET))


        transition_view = cls(
            attempts=attempts,
            id=id,
            state=state,
            time=time,
            duration_ms=duration_ms,
            error_response=error_response,
            error_response_encoding=error_response_encoding,
            error_type=error_type,
            response_status=response_status,
            retry_at=retry_at,
        )


        transition_view.additional_properties = d
        return transition_view

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
