"""What the hand-written layer adds, against a scripted server: idempotency keys kept across
retries, `503` retried after `Retry-After`, a `4xx` never, `504` reported as unknown."""

import json

import pytest

from spindle_sdk import OutcomeUnknown, Refused, Spindle, Unavailable

ACCEPTED = json.dumps({"transaction_id": "1", "jobs": [{"id": "01JDQ2Z7XW3V4Y5N6P7R8S9T0A", "bucket": "b"}]}).encode()
JOB = {"bucket": "b", "endpoint": "https://example.com/hook", "payload": {"n": 1}}


def error(code, message, field=None):
    return json.dumps({"error": {"code": code, "message": message, "field": field}}).encode()


def keys_sent(receiver):
    return [[j["idempotency_key"] for j in json.loads(r[3])["jobs"]] for r in receiver.requests]


def test_a_503_is_retried_as_told_with_the_same_keys(receiver):
    waits = []
    receiver.script = [
        (503, {"retry-after": "2"}, error("unavailable", "the JobDB is unavailable")),
        (503, {}, error("unavailable", "the JobDB is unavailable")),
        (202, {}, ACCEPTED),
    ]
    reply = Spindle(receiver.url, sleep=waits.append, backoff=0.5).submit([JOB, dict(JOB)])
    assert reply.jobs[0].id == "01JDQ2Z7XW3V4Y5N6P7R8S9T0A"
    sent = keys_sent(receiver)
    assert len(sent) == 3 and sent[0] == sent[1] == sent[2] and len(set(sent[0])) == 2
    assert waits[0] == 2.0 and 0.25 <= waits[1] <= 1.0


def test_a_4xx_is_never_retried(receiver):
    receiver.script = [(422, {}, error("invalid_field", "is not a valid URL", "jobs[0].endpoint"))]
    with pytest.raises(Refused) as refused:
        Spindle(receiver.url, sleep=lambda s: None).submit([{**JOB, "idempotency_key": "k1"}])
    assert (refused.value.status, refused.value.field) == (422, "jobs[0].endpoint")
    assert keys_sent(receiver) == [["k1"]]


def test_a_504_is_an_unknown_outcome_with_its_keys(receiver):
    receiver.script = [(504, {}, error("unavailable", "the write timed out"))]
    with pytest.raises(OutcomeUnknown) as unknown:
        Spindle(receiver.url, sleep=lambda s: None).publish({"bucket": "b", "event_type": "x", "payload": {}})
    assert len(receiver.requests) == 1
    assert unknown.value.keys == [json.loads(receiver.requests[0][3])["idempotency_key"]]


def test_503_past_the_retries_is_unavailable(receiver):
    receiver.script = [(503, {"retry-after": "0"}, error("unavailable", "down"))] * 3
    with pytest.raises(Unavailable):
        Spindle(receiver.url, retries=2, sleep=lambda s: None).submit([JOB])
    assert len(receiver.requests) == 3


def test_a_server_that_refuses_connections_is_tried_again_then_unavailable(receiver):
    url = receiver.url
    receiver.server.shutdown()
    receiver.server.server_close()
    waits = []
    with pytest.raises(Unavailable):
        Spindle(url, retries=2, sleep=waits.append).submit([JOB])
    assert len(waits) == 2
