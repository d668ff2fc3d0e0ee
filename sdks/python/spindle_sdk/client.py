"""`Spindle`: the producer's client, over the generated `spindle_api`."""

from __future__ import annotations

import email.utils
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from spindle_api import AuthenticatedClient, Client
from spindle_api.api.default import (
    add_subscription,
    backfill_subscription,
    get_job,
    job_attempts,
    list_events,
    list_jobs,
    list_subscriptions,
    publish_event,
    remove_subscription,
    show_subscription,
    submit_jobs,
    update_subscription,
)
from spindle_api.models import (
    AttemptList,
    BackfillReply,
    BackfillRequest,
    EventBatch,
    EventList,
    EventView,
    JobDescription,
    JobList,
    JobView,
    NewEvent,
    NewSubscription,
    PublishBatchReply,
    PublishReply,
    SubmitRequest,
    SubmitResponse,
    SubscriptionList,
    SubscriptionPatch,
    SubscriptionView,
)

#: Longest wait before a retry, in seconds, whatever `Retry-After` says.
MAX_RETRY_WAIT = 60.0


class SpindleError(Exception):
    """An answer other than a success: its status and what spindle said of it."""

    def __init__(
        self,
        status: int | None,
        code: str | None = None,
        message: str = "",
        field: str | None = None,
    ) -> None:
        self.status, self.code, self.message, self.field = status, code, message, field
        named = f" (field {field})" if field else ""
        super().__init__(f"{status} {code}: {message}{named}" if status else message)


class Refused(SpindleError):
    """A `4xx`: the request is wrong or not allowed, and nothing was stored. Sending it again
    gets the same answer, so it is never retried."""


class Unavailable(SpindleError):
    """`503` (or no connection) after every retry: nothing was stored; try again later."""


class OutcomeUnknown(SpindleError):
    """`504`, or the connection broke after the request left: it may or may not be stored.

    Send the same request again (the same idempotency keys: keep the jobs or event you passed,
    which now carry them) through a router: a job stored the first time is answered
    `duplicate` with its id, one that was not is stored now. Straight to a Director, which
    keeps no idempotency keys, a second send may store a second copy.
    """

    def __init__(self, status: int | None, message: str, keys: Sequence[str]) -> None:
        super().__init__(status, "outcome_unknown", message)
        #: The idempotency keys the request carried.
        self.keys = list(keys)


def _retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds (a number or an HTTP date), if the answer has one."""
    text = response.headers.get("retry-after")
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        when = email.utils.parsedate_to_datetime(text) if text else None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_WAIT)


def _error_of(response: httpx.Response) -> tuple[str | None, str, str | None]:
    try:
        detail = json.loads(response.content)["error"]
        return detail.get("code"), detail.get("message", ""), detail.get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, response.text[:200], None


def _keyed(item: Mapping[str, Any]) -> dict[str, Any]:
    """`item` with an idempotency key: its own, or a new random one."""
    out = dict(item)
    if not out.get("idempotency_key"):
        out["idempotency_key"] = str(uuid.uuid4())
    return out


def _given(filters: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """The arguments that were given (a filter left `None` is no filter)."""
    return {k: v for k, v in {**filters, **more}.items() if v is not None}


def _every(page: Callable[[str | None], Any], items: str) -> Iterator[Any]:
    """The `items` of every page `page(after)` answers, going on while a page names
    `next_after` (a short page included)."""
    after = None
    while True:
        answer = page(after)
        yield from getattr(answer, items)
        if not answer.next_after:
            return
        after = answer.next_after


class Spindle:
    """A client of one router (or Director).

    `retries`: how many times a `503` (or a refused connection) is tried again; the waits
    double from `backoff` seconds (with jitter) up to `max_backoff`, or are the answer's
    `Retry-After`. `timeout`: seconds for one request.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        retries: int = 5,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        limits = httpx.Timeout(timeout)
        self.api: Client | AuthenticatedClient = (
            AuthenticatedClient(base_url=base_url, token=token, timeout=limits)
            if token
            else Client(base_url=base_url, timeout=limits)
        )
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self._sleep = sleep

    def submit(self, jobs: Sequence[Mapping[str, Any]]) -> SubmitResponse:
        """Submits jobs (each as `POST /v1/jobs` takes it: `bucket`, `endpoint`, `payload`,
        ...), all stored in one transaction before the answer. A job without an
        `idempotency_key` gets one."""
        keyed = [_keyed(j) for j in jobs]
        body = SubmitRequest.from_dict({"jobs": keyed})
        keys = [j["idempotency_key"] for j in keyed]
        return self._call(submit_jobs, keys, body=body)

    def publish(
        self, events: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> PublishReply | PublishBatchReply:
        """Publishes an event (`bucket`, `event_type`, `payload`), or a list of up to 1,000 as
        one batch; each without an `idempotency_key` gets one."""
        if isinstance(events, Mapping):
            event = _keyed(events)
            return self._call(
                publish_event, [event["idempotency_key"]], body=NewEvent.from_dict(event)
            )
        keyed = [_keyed(e) for e in events]
        body = EventBatch.from_dict({"events": keyed})
        return self._call(publish_event, [e["idempotency_key"] for e in keyed], body=body)

    def job(self, job_id: str) -> JobView:
        """A job, its state and its transitions."""
        return self._call(get_job, [], id=job_id)

    def attempts(self, job_id: str) -> AttemptList:
        """A job's delivery attempts, first first."""
        return self._call(job_attempts, [], id=job_id)

    def jobs_page(self, *, after: str | None = None, limit: int = 100, **filters: Any) -> JobList:
        """One page of `GET /v1/jobs`: filters `bucket`, `endpoint`, `state`, `ordering_key`,
        `created_after`, `created_before` (datetimes), `order` (`"newest"`, the default, or
        `"oldest"`); `after` is the previous page's `next_after`. A page may be short and
        still have a `next_after`."""
        return self._call(list_jobs, [], **_given(filters, after=after, limit=limit))

    def jobs(self, *, page_size: int = 100, **filters: Any) -> Iterator[JobDescription]:
        """Every job the filters of `jobs_page` select, page after page."""
        return _every(lambda after: self.jobs_page(after=after, limit=page_size, **filters), "jobs")

    def events_page(self, *, after: str | None = None, limit: int = 100, **filters: Any) -> EventList:
        """One page of `GET /v1/events`: filters `bucket`, `event_type` (with `bucket`),
        `created_after`, `created_before`, `order`; as `jobs_page`."""
        return self._call(list_events, [], **_given(filters, after=after, limit=limit))

    def events(self, *, page_size: int = 100, **filters: Any) -> Iterator[EventView]:
        """Every event the filters of `events_page` select, page after page."""
        return _every(lambda after: self.events_page(after=after, limit=page_size, **filters), "events")

    def add_subscription(self, spec: Mapping[str, Any]) -> SubscriptionView:
        """Adds a subscription (`bucket`, `url`, `event_types`, ...); the answer shows its
        secret, once."""
        return self._call(add_subscription, [], body=NewSubscription.from_dict(dict(spec)))

    def subscriptions(self, bucket: str | None = None) -> SubscriptionList:
        """The subscriptions (of `bucket`), first page."""
        kwargs: dict[str, Any] = {} if bucket is None else {"bucket": bucket}
        return self._call(list_subscriptions, [], **kwargs)

    def subscription(self, subscription_id: str) -> SubscriptionView:
        """One subscription."""
        return self._call(show_subscription, [], id=subscription_id)

    def update_subscription(
        self, subscription_id: str, change: Mapping[str, Any], version: int | None = None
    ) -> SubscriptionView:
        """Changes only the fields given (`enabled`, `url`, `event_types`); with `version` (a
        view's), only if nobody changed it since (`412` otherwise, a `Refused`)."""
        kwargs: dict[str, Any] = {"id": subscription_id, "body": SubscriptionPatch.from_dict(dict(change))}
        if version is not None:
            kwargs["if_match"] = f'"{version}"'
        return self._call(update_subscription, [], **kwargs)

    def remove_subscription(self, subscription_id: str) -> SubscriptionView:
        """Removes a subscription (its waiting jobs are discarded)."""
        return self._call(remove_subscription, [], id=subscription_id)

    def backfill(self, subscription_id: str, events: Sequence[Mapping[str, Any]]) -> BackfillReply:
        """Delivers past events (`event_id`, `event_type`, `timestamp`, `data`) to a
        subscription, once each."""
        body = BackfillRequest.from_dict({"events": [dict(e) for e in events]})
        return self._call(backfill_subscription, [], id=subscription_id, body=body)

    def _wait(self, attempt: int, response: httpx.Response | None) -> None:
        told = _retry_after(response) if response is not None else None
        if told is None:
            ceiling = min(self.max_backoff, self.backoff * (2**attempt))
            told = random.uniform(ceiling / 2, ceiling)
        self._sleep(told)

    def _call(self, operation: Any, keys: Sequence[str], **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                answer = operation.sync_detailed(client=self.api, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                # Never reached the server: nothing was stored.
                if attempt >= self.retries:
                    raise Unavailable(None, "unreachable", str(e)) from e
                self._wait(attempt, None)
                attempt += 1
                continue
            except httpx.TransportError as e:
                raise OutcomeUnknown(None, f"the request was sent, no answer: {e}", keys) from e
            status = int(answer.status_code)
            if 200 <= status < 300:
                return answer.parsed
            raw = httpx.Response(status, headers=answer.headers, content=answer.content)
            code, message, field = _error_of(raw)
            if status == 503 and attempt < self.retries:
                self._wait(attempt, raw)
                attempt += 1
                continue
            if status == 503:
                raise Unavailable(status, code, message, field)
            if status == 504:
                raise OutcomeUnknown(status, message, keys)
            if 400 <= status < 500:
                raise Refused(status, code, message, field)
            raise SpindleError(status, code, message, field)
