"""The receiver-side check agrees with the standardwebhooks package on shared vectors."""

import base64
from datetime import datetime, timezone
from unittest import mock

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError as TheirError

from spindle_sdk import WebhookVerificationError, sign, verify


def headers(v):
    return {"webhook-id": v["id"], "webhook-timestamp": str(v["timestamp"]), "webhook-signature": v["signature"]}


def test_every_vector_is_judged_as_stated(vectors):
    for v in vectors:
        body = v["body"].encode()
        if v["valid"]:
            verify(v["secret"], headers(v), body, now=v["now"])
        else:
            with pytest.raises(WebhookVerificationError):
                verify(v["secret"], headers(v), body, now=v["now"])


def test_the_standardwebhooks_package_judges_them_alike(vectors):
    for v in vectors:
        at = datetime.fromtimestamp(v["now"], tz=timezone.utc)
        with mock.patch("standardwebhooks.webhooks.datetime") as clock:
            clock.now.return_value = at
            clock.fromtimestamp.side_effect = datetime.fromtimestamp
            try:
                Webhook(v["secret"]).verify(v["body"], headers(v), json_parse=False)
                theirs = True
            except TheirError:
                theirs = False
        assert theirs == v["valid"], v["why"]


def test_sign_makes_the_packages_signatures(vectors):
    for v in (v for v in vectors if v["why"] == "signed by the secret"):
        assert sign(v["secret"], v["id"], v["timestamp"], v["body"].encode()) == v["signature"]


def test_a_rotated_secret_and_missing_headers():
    old, new = ("whsec_" + base64.b64encode(bytes([n] * 32)).decode() for n in (1, 2))
    body = b'{"a":1}'
    h = {"Webhook-Id": "m1", "Webhook-Timestamp": "1000", "Webhook-Signature": sign(old, "m1", 1000, body)}
    assert verify([new, old], h, body, now=1000) == {"a": 1}
    with pytest.raises(WebhookVerificationError):
        verify(new, h, body, now=1000)
    with pytest.raises(WebhookVerificationError, match="webhook-signature"):
        verify(old, {"webhook-id": "m1", "webhook-timestamp": "1000"}, body, now=1000)
