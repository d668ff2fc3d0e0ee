from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...types import Response, UNSET
from ... import errors

from ...models.backfill_reply import BackfillReply
from ...models.backfill_request import BackfillRequest
from ...models.error_body import ErrorBody
from typing import cast



def _get_kwargs(
    id: str,
    *,
    body: BackfillRequest,

) -> dict[str, Any]:
    headers: dict[str, Any] = {}


    

    

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/subscriptions/{id}/backfill".format(id=quote(str(id), safe=""),),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs



def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> BackfillReply | ErrorBody | None:
    if response.status_code == 202:
        response_202 = BackfillReply.from_dict(response.json())



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

    if response.status_code == 404:
        response_404 = ErrorBody.from_dict(response.json())



        return response_404

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


def _build_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Response[BackfillReply | ErrorBody]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: BackfillRequest,

) -> Response[BackfillReply | ErrorBody]:
    """ Deliver past events to a subscription added after them (`spindle subscriptions backfill`
    reads them from a JobDB or the archive): one job per event it wants (types, filter), with
    the event's own id and timestamp, all persisted in one transaction before the answer. A
    Director skips events that have a job of the subscription in its JobDB; a router skips
    those back-filled to it before within its dedup window, through any router.

    Args:
        id (str):
        body (BackfillRequest): `POST /v1/subscriptions/{id}/backfill` body: past events to
            deliver to one subscription
            (added after they were published), as a back-fill reads them from a JobDB or the archive.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BackfillReply | ErrorBody]
     """


    kwargs = _get_kwargs(
        id=id,
body=body,

    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)

def sync(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: BackfillRequest,

) -> BackfillReply | ErrorBody | None:
    """ Deliver past events to a subscription added after them (`spindle subscriptions backfill`
    reads them from a JobDB or the archive): one job per event it wants (types, filter), with
    the event's own id and timestamp, all persisted in one transaction before the answer. A
    Director skips events that have a job of the subscription in its JobDB; a router skips
    those back-filled to it before within its dedup window, through any router.

    Args:
        id (str):
        body (BackfillRequest): `POST /v1/subscriptions/{id}/backfill` body: past events to
            deliver to one subscription
            (added after they were published), as a back-fill reads them from a JobDB or the archive.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BackfillReply | ErrorBody
     """


    return sync_detailed(
        id=id,
client=client,
body=body,

    ).parsed

async def asyncio_detailed(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: BackfillRequest,

) -> Response[BackfillReply | ErrorBody]:
    """ Deliver past events to a subscription added after them (`spindle subscriptions backfill`
    reads them from a JobDB or the archive): one job per event it wants (types, filter), with
    the event's own id and timestamp, all persisted in one transaction before the answer. A
    Director skips events that have a job of the subscription in its JobDB; a router skips
    those back-filled to it before within its dedup window, through any router.

    Args:
        id (str):
        body (BackfillRequest): `POST /v1/subscriptions/{id}/backfill` body: past events to
            deliver to one subscription
            (added after they were published), as a back-fill reads them from a JobDB or the archive.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BackfillReply | ErrorBody]
     """


    kwargs = _get_kwargs(
        id=id,
body=body,

    )

    response = await client.get_async_httpx_client().request(
        **kwargs
    )

    return _build_response(client=client, response=response)

async def asyncio(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: BackfillRequest,

) -> BackfillReply | ErrorBody | None:
    """ Deliver past events to a subscription added after them (`spindle subscriptions backfill`
    reads them from a JobDB or the archive): one job per event it wants (types, filter), with
    the event's own id and timestamp, all persisted in one transaction before the answer. A
    Director skips events that have a job of the subscription in its JobDB; a router skips
    those back-filled to it before within its dedup window, through any router.

    Args:
        id (str):
        body (BackfillRequest): `POST /v1/subscriptions/{id}/backfill` body: past events to
            deliver to one subscription
            (added after they were published), as a back-fill reads them from a JobDB or the archive.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BackfillReply | ErrorBody
     """


    return (await asyncio_detailed(
        id=id,
client=client,
body=body,

    )).parsed
