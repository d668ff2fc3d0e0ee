"""Receiving deliveries: Standard Webhooks signatures (https://www.standardwebhooks.com).

A delivery carries `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature`:
space-separated `v1,<base64 HMAC-SHA256>` entries (several while a secret rotates) over
`{id}.{timestamp}.{body}`, keyed by the base64 after `whsec_` in the subscription's secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: How far a delivery's timestamp may be from now, in seconds, either way.
DEFAULT_TOLERANCE = 5 * 60


class WebhookVerificationError(Exception):
    """A delivery that is not signed by any of the given secrets, or not now."""


def _key(secret: str) -> bytes:
    text = secret[len("whsec_") :] if secret.startswith("whsec_") else secret
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise WebhookVerificationError("the secret is not whsec_ followed by base64") from e


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """The `v1,<signature>` entry a sender puts in `webhook-signature` (`timestamp` as the
    `webhook-timestamp` header has it)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    secrets: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: int = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> Any:
    """Checks a delivery and returns its body as JSON (or the bytes when it is not JSON).

    `secrets`: the subscription's secret, or several while one is rotated out. `headers`: the
    request's headers (any case). Raises `WebhookVerificationError` when a header is missing,
    the timestamp is more than `tolerance` seconds from now, or no signature matches.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id = lower["webhook-id"]
        stamp = lower["webhook-timestamp"]
        given = lower["webhook-signature"]
    except KeyError as e:
        raise WebhookVerificationError(f"missing header {e.args[0]}") from e
    if not re.fullmatch(r"-?[0-9]+", stamp):
        raise WebhookVerificationError("webhook-timestamp is not an integer")
    timestamp = int(stamp)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too far from now")
    if isinstance(secrets, str):
        secrets = [secrets]
    # Signed as the header has it, as the sender signed it.
    expected = [sign(s, msg_id, stamp, body) for s in secrets]
    for entry in given.split(" "):
        if any(hmac.compare_digest(entry.encode(), e.encode()) for e in expected):
            try:
                return json.loads(body)
            except ValueError:
                return body
    raise WebhookVerificationError("no signature matches")
