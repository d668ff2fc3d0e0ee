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
  from ..models.blocked_key import BlockedKey
  from ..models.import_job import ImportJob
  from ..models.kept_event import KeptEvent





T = TypeVar("T", bound="ImportRequest")



@_attrs_define
class ImportRequest:
    """ Jobs moved out of a retired JobDB.

        Attributes:
            jobdb (str): The JobDB the caller expects this Director to own (409 if it owns another).
            jobs (list[ImportJob]): 1 to 1000 jobs (none when the request only carries `blocked_keys` or `events`).
            blocked_keys (list[BlockedKey] | Unset): Moves only: ordered keys blocked in the retired JobDB (a job that asked
                to block its key
                ended without success there), carried so the block follows the key: stored in this
                JobDB with the same transaction as `jobs`; a key blocked here already keeps its block.
            events (list[KeptEvent] | Unset): New events only (a router's publish): events that matched no subscription,
                kept in the
                same transaction as `jobs` (which may then be empty) so they keep their ids.
            from_jobdb (None | str | Unset): The retired JobDB the jobs come from; absent for new jobs forwarded by a
                router.
            not_after (datetime.datetime | None | Unset): New jobs only: refuse the request (409, nothing stored) once this
                instant has passed.
     """

    jobdb: str
    jobs: list[ImportJob]
    blocked_keys: list[BlockedKey] | Unset = UNSET
    events: list[KeptEvent] | Unset = UNSET
    from_jobdb: None | str | Unset = UNSET
    not_after: datetime.datetime | None | Unset = UNSET





    def to_dict(self) -> dict[str, Any]:
        from ..models.blocked_key import BlockedKey # noqa: PLC0415
        from ..models.import_job import ImportJob # noqa: PLC0415
        from ..models.kept_event import KeptEvent # noqa: PLC0415
        jobdb = self.jobdb

        jobs = []
        for jobs_item_data in self.jobs:
            jobs_item = jobs_item_data.to_dict()
            jobs.append(jobs_item)



        blocked_keys: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.blocked_keys, Unset):
            blocked_keys = []
            for blocked_keys_item_data in self.blocked_keys:
                blocked_keys_item = blocked_keys_item_data.to_dict()
                blocked_keys.append(blocked_keys_item)



        events: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.events, Unset):
            events = []
            for events_item_data in self.events:
                events_item = events_item_data.to_dict()
                events.append(events_item)



        from_jobdb: None | str | Unset
        if isinstance(self.from_jobdb, Unset):
            from_jobdb = UNSET
        else:
            from_jobdb = self.from_jobdb

        not_after: None | str | Unset
        if isinstance(self.not_after, Unset):
            not_after = UNSET
        elif isinstance(self.not_after, datetime.datetime):
            not_after = self.not_after.isoformat()
        else:
            not_after = self.not_after


        field_dict: dict[str, Any] = {}

        field_dict.update({
            "jobdb": jobdb,
            "jobs": jobs,
        })
        if blocked_keys is not UNSET:
            field_dict["blocked_keys"] = blocked_keys
        if events is not UNSET:
            field_dict["events"] = events
        if from_jobdb is not UNSET:
            field_dict["from_jobdb"] = from_jobdb
        if not_after is not UNSET:
            field_dict["not_after"] = not_after

        return field_dict



    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.blocked_key import BlockedKey # noqa: PLC0415
        from ..models.import_job import ImportJob # noqa: PLC0415
        from ..models.kept_event import KeptEvent # noqa: PLC0415
        d = dict(src_dict)
        jobdb = d.pop("jobdb")

        jobs = []
        _jobs = d.pop("jobs")
        for jobs_item_data in (_jobs):
            jobs_item = ImportJob.from_dict(jobs_item_data)



            jobs.append(jobs_item)


        _blocked_keys = d.pop("blocked_keys", UNSET)
        blocked_keys: list[BlockedKey] | Unset = UNSET
        if _blocked_keys is not UNSET:
            blocked_keys = []
            for blocked_keys_item_data in _blocked_keys:
                blocked_keys_item = BlockedKey.from_dict(blocked_keys_item_data)



                blocked_keys.append(blocked_keys_item)


        _events = d.pop("events", UNSET)
        events: list[KeptEvent] | Unset = UNSET
        if _events is not UNSET:
            events = []
            for events_item_data in _events:
                events_item = KeptEvent.from_dict(events_item_data)



                events.append(events_item)


        def _parse_from_jobdb(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        from_jobdb = _parse_from_jobdb(d.pop("from_jobdb", UNSET))


        def _parse_not_after(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                not_after_type_0 = datetime.datetime.fromisoformat(data)



                return not_after_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        not_after = _parse_not_after(d.pop("not_after", UNSET))


        import_request = cls(
            jobdb=jobdb,
            jobs=jobs,
            blocked_keys=blocked_keys,
            events=events,
            from_jobdb=from_jobdb,
            not_after=not_after,
        )

        return import_request

