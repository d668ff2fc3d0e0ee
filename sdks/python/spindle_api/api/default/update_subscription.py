from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...types import Response, UNSET
from ... import errors

from ...models.error_body import ErrorBody
from ...models.subscription_patch import SubscriptionPatch
from ...models.subscription_view import SubscriptionView
from ...types import UNSET, Unset
from typing import cast



def _get_kwargs(
    id: str,
    *,
    body: SubscriptionPatch,
    if_match: None | str | Unset = UNSET,

) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(if_match, Unset):
        headers["If-Match"] = if_match



    

    

    _kwargs: dict[str, Any] = {
        "method": "patch",
        "url": "/v1/subscriptions/{id}".format(id=quote(str(id), safe=""),),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs



def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> ErrorBody | SubscriptionView | None:
    if response.status_code == 200:
        response_200 = SubscriptionView.from_dict(response.json())



        return response_200

    if response.status_code == 400:
        response_400 = ErrorBody.from_dict(response.json())



        return response_400

    if response.status_code == 401:
        response_401 = ErrorBody.from_dict(response.json())



        return response_401

    if response.status_code == 404:
        response_404 = ErrorBody.from_dict(response.json())



        return response_404

    if response.status_code == 409:
        response_409 = ErrorBody.from_dict(response.json())



        return response_409

    if response.status_code == 412:
        response_412 = ErrorBody.from_dict(response.json())



        return response_412

    if response.status_code == 413:
        response_413 = ErrorBody.from_dict(response.json())



        return response_413

    if response.status_code == 422:
        response_422 = ErrorBody.from_dict(response.json())



        return response_422

    if response.status_code == 503:
        response_503 = ErrorBody.from_dict(response.json())



        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Response[ErrorBody | SubscriptionView]:
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
    body: SubscriptionPatch,
    if_match: None | str | Unset = UNSET,

) -> Response[ErrorBody | SubscriptionView]:
    """ Change a subscription: enable or disable it (a disabled one's jobs wait), its URL, its
    event types. Only the fields named change, on the subscription as stored now; with
    `If-Match`, only if it is still at that version.

    Args:
        id (str):
        if_match (None | str | Unset):
        body (SubscriptionPatch): `PATCH /v1/subscriptions/{id}` body: the fields to change.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | SubscriptionView]
     """


    kwargs = _get_kwargs(
        id=id,
body=body,
if_match=if_match,

    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)

def sync(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: SubscriptionPatch,
    if_match: None | str | Unset = UNSET,

) -> ErrorBody | SubscriptionView | None:
    """ Change a subscription: enable or disable it (a disabled one's jobs wait), its URL, its
    event types. Only the fields named change, on the subscription as stored now; with
    `If-Match`, only if it is still at that version.

    Args:
        id (str):
        if_match (None | str | Unset):
        body (SubscriptionPatch): `PATCH /v1/subscriptions/{id}` body: the fields to change.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | SubscriptionView
     """


    return sync_detailed(
        id=id,
client=client,
body=body,
if_match=if_match,

    ).parsed

async def asyncio_detailed(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: SubscriptionPatch,
    if_match: None | str | Unset = UNSET,

) -> Response[ErrorBody | SubscriptionView]:
    """ Change a subscription: enable or disable it (a disabled one's jobs wait), its URL, its
    event types. Only the fields named change, on the subscription as stored now; with
    `If-Match`, only if it is still at that version.

    Args:
        id (str):
        if_match (None | str | Unset):
        body (SubscriptionPatch): `PATCH /v1/subscriptions/{id}` body: the fields to change.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | SubscriptionView]
     """


    kwargs = _get_kwargs(
        id=id,
body=body,
if_match=if_match,

    )

    response = await client.get_async_httpx_client().request(
        **kwargs
    )

    return _build_response(client=client, response=response)

async def asyncio(
    id: str,
    *,
    client: AuthenticatedClient | Client,
    body: SubscriptionPatch,
    if_match: None | str | Unset = UNSET,

) -> ErrorBody | SubscriptionView | None:
    """ Change a subscription: enable or disable it (a disabled one's jobs wait), its URL, its
    event types. Only the fields named change, on the subscription as stored now; with
    `If-Match`, only if it is still at that version.

    Args:
        id (str):
        if_match (None | str | Unset):
        body (SubscriptionPatch): `PATCH /v1/subscriptions/{id}` body: the fields to change.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | SubscriptionView
     """


    return (await asyncio_detailed(
        id=id,
client=client,
body=body,
if_match=if_match,

    )).parsed
