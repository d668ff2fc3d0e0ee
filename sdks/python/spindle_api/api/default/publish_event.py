from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...types import Response, UNSET
from ... import errors

from ...models.error_body import ErrorBody
from ...models.event_batch import EventBatch
from ...models.new_event import NewEvent
from ...models.publish_batch_reply import PublishBatchReply
from ...models.publish_reply import PublishReply
from ...types import UNSET, Unset
from typing import cast



def _get_kwargs(
    *,
    body: EventBatch | NewEvent,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(traceparent, Unset):
        headers["traceparent"] = traceparent

    if not isinstance(tracestate, Unset):
        headers["tracestate"] = tracestate



    

    

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/events",
    }

    
    if isinstance(body, NewEvent):
        _kwargs["json"] = body.to_dict()
    else:
        _kwargs["json"] = body.to_dict()


    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs



def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> ErrorBody | PublishBatchReply | PublishReply | None:
    if response.status_code == 202:
        def _parse_response_202(data: object) -> PublishBatchReply | PublishReply:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                componentsschemas_publish_answer_type_0 = PublishReply.from_dict(data)



                return componentsschemas_publish_answer_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            componentsschemas_publish_answer_type_1 = PublishBatchReply.from_dict(data)



            return componentsschemas_publish_answer_type_1

        response_202 = _parse_response_202(response.json())

        return response_202

    if response.status_code == 400:
        response_400 = ErrorBody.from_dict(response.json())



        return response_400

    if response.status_code == 401:
        response_401 = ErrorBody.from_dict(response.json())



        return response_401

    if response.status_code == 403:
        response_403 = ErrorBody.from_dict(response.json())



        return response_403

    if response.status_code == 413:
        response_413 = ErrorBody.from_dict(response.json())



        return response_413

    if response.status_code == 422:
        response_422 = ErrorBody.from_dict(response.json())



        return response_422

    if response.status_code == 429:
        response_429 = ErrorBody.from_dict(response.json())



        return response_429

    if response.status_code == 503:
        response_503 = ErrorBody.from_dict(response.json())



        return response_503

    if response.status_code == 504:
        response_504 = ErrorBody.from_dict(response.json())



        return response_504

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Response[ErrorBody | PublishBatchReply | PublishReply]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: EventBatch | NewEvent,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> Response[ErrorBody | PublishBatchReply | PublishReply]:
    """ Publish an event, or a batch of 1 to 1,000 (`{"events": [...]}`): one job per matching
    subscription of its bucket (exact type, prefix wildcard, payload filter), all of the
    request's jobs persisted in one transaction before the answer; an event no subscription
    wants is kept (it has an id, and a later subscription can be back-filled with it).
    Through a router, a repeated `idempotency_key` (within the dedup window) stores nothing and
    answers the first event, `duplicate: true`.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (EventBatch | NewEvent): `POST /v1/events` body: one event, or a batch of events.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | PublishBatchReply | PublishReply]
     """


    kwargs = _get_kwargs(
        body=body,
traceparent=traceparent,
tracestate=tracestate,

    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)

def sync(
    *,
    client: AuthenticatedClient | Client,
    body: EventBatch | NewEvent,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> ErrorBody | PublishBatchReply | PublishReply | None:
    """ Publish an event, or a batch of 1 to 1,000 (`{"events": [...]}`): one job per matching
    subscription of its bucket (exact type, prefix wildcard, payload filter), all of the
    request's jobs persisted in one transaction before the answer; an event no subscription
    wants is kept (it has an id, and a later subscription can be back-filled with it).
    Through a router, a repeated `idempotency_key` (within the dedup window) stores nothing and
    answers the first event, `duplicate: true`.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (EventBatch | NewEvent): `POST /v1/events` body: one event, or a batch of events.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | PublishBatchReply | PublishReply
     """


    return sync_detailed(
        client=client,
body=body,
traceparent=traceparent,
tracestate=tracestate,

    ).parsed

async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: EventBatch | NewEvent,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> Response[ErrorBody | PublishBatchReply | PublishReply]:
    """ Publish an event, or a batch of 1 to 1,000 (`{"events": [...]}`): one job per matching
    subscription of its bucket (exact type, prefix wildcard, payload filter), all of the
    request's jobs persisted in one transaction before the answer; an event no subscription
    wants is kept (it has an id, and a later subscription can be back-filled with it).
    Through a router, a repeated `idempotency_key` (within the dedup window) stores nothing and
    answers the first event, `duplicate: true`.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (EventBatch | NewEvent): `POST /v1/events` body: one event, or a batch of events.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | PublishBatchReply | PublishReply]
     """


    kwargs = _get_kwargs(
        body=body,
traceparent=traceparent,
tracestate=tracestate,

    )

    response = await client.get_async_httpx_client().request(
        **kwargs
    )

    return _build_response(client=client, response=response)

async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: EventBatch | NewEvent,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> ErrorBody | PublishBatchReply | PublishReply | None:
    """ Publish an event, or a batch of 1 to 1,000 (`{"events": [...]}`): one job per matching
    subscription of its bucket (exact type, prefix wildcard, payload filter), all of the
    request's jobs persisted in one transaction before the answer; an event no subscription
    wants is kept (it has an id, and a later subscription can be back-filled with it).
    Through a router, a repeated `idempotency_key` (within the dedup window) stores nothing and
    answers the first event, `duplicate: true`.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (EventBatch | NewEvent): `POST /v1/events` body: one event, or a batch of events.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | PublishBatchReply | PublishReply
     """


    return (await asyncio_detailed(
        client=client,
body=body,
traceparent=traceparent,
tracestate=tracestate,

    )).parsed
