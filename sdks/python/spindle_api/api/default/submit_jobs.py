from http import HTTPStatus
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...types import Response, UNSET
from ... import errors

from ...models.error_body import ErrorBody
from ...models.submit_request import SubmitRequest
from ...models.submit_response import SubmitResponse
from ...types import UNSET, Unset
from typing import cast



def _get_kwargs(
    *,
    body: SubmitRequest,
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
        "url": "/v1/jobs",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs



def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> ErrorBody | SubmitResponse | None:
    if response.status_code == 202:
        response_202 = SubmitResponse.from_dict(response.json())



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


def _build_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> Response[ErrorBody | SubmitResponse]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: SubmitRequest,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> Response[ErrorBody | SubmitResponse]:
    """ Submit jobs. The whole batch is persisted in one transaction before the answer.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (SubmitRequest): `POST /v1/jobs` body.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | SubmitResponse]
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
    body: SubmitRequest,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> ErrorBody | SubmitResponse | None:
    """ Submit jobs. The whole batch is persisted in one transaction before the answer.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (SubmitRequest): `POST /v1/jobs` body.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | SubmitResponse
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
    body: SubmitRequest,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> Response[ErrorBody | SubmitResponse]:
    """ Submit jobs. The whole batch is persisted in one transaction before the answer.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (SubmitRequest): `POST /v1/jobs` body.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorBody | SubmitResponse]
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
    body: SubmitRequest,
    traceparent: None | str | Unset = UNSET,
    tracestate: None | str | Unset = UNSET,

) -> ErrorBody | SubmitResponse | None:
    """ Submit jobs. The whole batch is persisted in one transaction before the answer.

    Args:
        traceparent (None | str | Unset):
        tracestate (None | str | Unset):
        body (SubmitRequest): `POST /v1/jobs` body.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorBody | SubmitResponse
     """


    return (await asyncio_detailed(
        client=client,
body=body,
traceparent=traceparent,
tracestate=tracestate,

    )).parsed
