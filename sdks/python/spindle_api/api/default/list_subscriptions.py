from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...types import Response, UNSET
from ... import errors

from ...models.error_body import ErrorBody
from ...models.subscription_list import SubscriptionList
from ...types import UNSET, Unset
from typing import cast



def _get_kwargs(
    *,
    bucket: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = UNSET,

) -> dict[str, Any]:
    

    

    params: dict[str, Any] = {}

    params["bucket"] = bucket

    params["after"] = after

    params["limit"] = limit


    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}


    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/subscriptions",
        "params": params,
    }


    return _kwargs



def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> ErrorBody | SubscriptionList | None:
    if response.status_code == 200:
        response_200 = SubscriptionList.from_dict(response.json())



        return response_200

    if response.status_code == 401:
        response_401 = ErrorBody.from_dict(response.json())



        return response_401

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


def _build_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Response[ErrorBody | SubscriptionList]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    bucket: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = UNSET,

) -> Response[ErrorBody | SubscriptionList]:
    """ The subscriptions the token may see (of one bucket with `?bucket=`), by id, a page at a
    time: `next_after` names where the next page starts.

    Args:
        bucket (str | Unset):
        after (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | SubscriptionList]
     """


    kwargs = _get_kwargs(
        bucket=bucket,
after=after,
limit=limit,

    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)

def sync(
    *,
    client: AuthenticatedClient | Client,
    bucket: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = UNSET,

) -> ErrorBody | SubscriptionList | None:
    """ The subscriptions the token may see (of one bucket with `?bucket=`), by id, a page at a
    time: `next_after` names where the next page starts.

    Args:
        bucket (str | Unset):
        after (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | SubscriptionList
     """


    return sync_detailed(
        client=client,
bucket=bucket,
after=after,
limit=limit,

    ).parsed

async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    bucket: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = UNSET,

) -> Response[ErrorBody | SubscriptionList]:
    """ The subscriptions the token may see (of one bucket with `?bucket=`), by id, a page at a
    time: `next_after` names where the next page starts.

    Args:
        bucket (str | Unset):
        after (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | SubscriptionList]
     """


    kwargs = _get_kwargs(
        bucket=bucket,
after=after,
limit=limit,

    )

    response = await client.get_async_httpx_client().request(
        **kwargs
    )

    return _build_response(client=client, response=response)

async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    bucket: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = UNSET,

) -> ErrorBody | SubscriptionList | None:
    """ The subscriptions the token may see (of one bucket with `?bucket=`), by id, a page at a
    time: `next_after` names where the next page starts.

    Args:
        bucket (str | Unset):
        after (str | Unset):
        limit (int | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | SubscriptionList
     """


    return (await asyncio_detailed(
        client=client,
bucket=bucket,
after=after,
limit=limit,

    )).parsed
