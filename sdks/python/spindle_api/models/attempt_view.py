from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, BinaryIO, TextIO, TYPE_CHECKING, Generator

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

from ..types import UNSET, Unset
from typing import cast
import datetime






T = TypeVar("T", bound="AttemptView")



@_attrs_define
class AttemptView:
    """ One delivery attempt of a job: when it started, and how it ended (absent while under way).

        Attributes:
            attempt (int): Its number (1 for the first).
            started_at (datetime.datetime): When it started.
            duration_ms (int | None | Unset): How long it took.
            ended_at (datetime.datetime | None | Unset): When it ended; absent while it is under way.
            error_response (None | str | Unset): Start of the failed answer (text, or base64 when `error_response_encoding`
                is `base64`).
            error_response_encoding (None | str | Unset): `utf-8` or `base64`.
            error_type (None | str | Unset): The failure kind, when it failed.
            outcome (None | str | Unset): The state it left the job in (`succeeded`, `awaiting-retry`, `discarded`); absent
                while
                under way. Example: awaiting-retry.
            response_status (int | None | Unset): The endpoint's status code, when it answered.
            retry_at (datetime.datetime | None | Unset): When the next attempt is due, when this one left the job awaiting a
                retry.
     """

    attempt: int
    started_at: datetime.datetime
    duration_ms: int | None | Unset = UNSET
    ended_at: datetime.datetime | None | Unset = UNSET
    error_response: None | str | Unset = UNSET
    error_response_encoding: None | str | Unset = UNSET
    error_type: None | str | Unset = UNSET
    outcome: None | str | Unset = UNSET
    response_status: int | None | Unset = UNSET
    retry_at: datetime.datetime | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)





    def to_dict(self) -> dict[str, Any]:
        attempt = self.attempt

        started_at = self.started_at.isoformat()

        duration_ms: int | None | Unset
        if isinstance(self.duration_ms, Unset):
            duration_ms = UNSET
        else:
            duration_ms = self.duration_ms

        ended_at: None | str | Unset
        if isinstance(self.ended_at, Unset):
            ended_at = UNSET
        elif isinstance(self.ended_at, datetime.datetime):
            ended_at = self.ended_at.isoformat()
        else:
            ended_at = self.ended_at

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

        outcome: None | str | Unset
        if isinstance(self.outcome, Unset):
            outcome = UNSET
        else:
            outcome = self.outcome

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
            "attempt": attempt,
            "started_at": started_at,
        })
        if duration_ms is not UNSET:
            field_dict["duration_ms"] = duration_ms
        if ended_at is not UNSET:
            field_dict["ended_at"] = ended_at
        if error_response is not UNSET:
            field_dict["error_response"] = error_response
        if error_response_encoding is not UNSET:
            field_dict["error_response_encoding"] = error_response_encoding
        if error_type is not UNSET:
            field_dict["error_type"] = error_type
        if outcome is not UNSET:
            field_dict["outcome"] = outcome
        if response_status is not UNSET:
            field_dict["response_status"] = response_status
        if retry_at is not UNSET:
            field_dict["retry_at"] = retry_at

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        d = dict(src_dict)
        attempt = d.pop("attempt")

        started_at = datetime.datetime.fromisoformat(d.pop("started_at"))




        def _parse_duration_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        duration_ms = _parse_duration_ms(d.pop("duration_ms", UNSET))


        def _parse_ended_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                ended_at_type_0 = datetime.datetime.fromisoformat(data)



                return ended_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        ended_at = _parse_ended_at(d.pop("ended_at", UNSET))


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


        def _parse_outcome(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        outcome = _parse_outcome(d.pop("outcome", UNSET))


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


        attempt_view = cls(
            attempt=attempt,
            started_at=started_at,
            duration_ms=duration_ms,
            ended_at=ended_at,
            error_response=error_response,
            error_response_encoding=error_response_encoding,
            error_type=error_type,
            outcome=outcome,
            response_status=response_status,
            retry_at=retry_at,
        )


        attempt_view.additional_properties = d
        return attempt_view

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
