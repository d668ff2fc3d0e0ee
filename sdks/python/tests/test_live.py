"""Against a live router and Director (`tests/sdks.rs` starts them): a job submitted through
the router reaches its endpoint; a repeat of its key is a duplicate; a subscription's event
arrives signed so `verify` accepts it; a bad field is refused naming it."""

import time
import uuid

import pytest

from spindle_sdk import Refused, Spindle, verify


def wait_state(spindle, job_id, state, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = spindle.job(job_id)
        if view.state == state:
            return view
        time.sleep(0.1)
    pytest.fail(f"job {job_id} did not reach {state}")


def test_a_job_through_the_router_is_delivered_once(router_url, receiver):
    spindle = Spindle(router_url)
    bucket = f"py-{uuid.uuid4().hex[:8]}"
    job = {"bucket": bucket, "endpoint": receiver.url + "/jobs", "payload": {"from": "python"}}
    reply = spindle.submit([job])
    job_id = reply.jobs[0].id
    wait_state(spindle, job_id, "succeeded")
    [(method, path, headers, body)] = receiver.wait(1, "/jobs")
    assert (method, body) == ("POST", b'{"from":"python"}')
    assert headers["spindle-job-id"] == job_id
    again = spindle.submit([{**job, "idempotency_key": "fixed-" + bucket}])
    repeat = spindle.submit([{**job, "idempotency_key": "fixed-" + bucket}])
    assert repeat.jobs[0].id == again.jobs[0].id
    assert str(repeat.jobs[0].status) == "duplicate"


def test_an_event_arrives_signed_for_its_subscription(router_url, receiver):
    spindle = Spindle(router_url)
    bucket = f"py-{uuid.uuid4().hex[:8]}"
    sub = spindle.add_subscription({"bucket": bucket, "url": receiver.url + "/events", "event_types": ["order.*"]})
    assert any(s.id == sub.id for s in spindle.subscriptions(bucket).subscriptions)
    # Routers and Directors read a new subscription from the control database within ~1 s.
    time.sleep(2.5)
    reply = spindle.publish({"bucket": bucket, "event_type": "order.paid", "payload": {"n": 7}})
    assert len(reply.deliveries) == 1
    [(_, _, headers, body)] = receiver.wait(1, "/events")
    envelope = verify(sub.secret, headers, body)
    assert envelope["type"] == "order.paid" and envelope["data"] == {"n": 7}
    with pytest.raises(Exception):
        verify("whsec_" + "A" * 32, headers, body)
    spindle.remove_subscription(sub.id)


def test_a_bad_field_is_refused_by_name(director_url):
    with pytest.raises(Refused) as refused:
        Spindle(director_url).submit([{"bucket": "b", "endpoint": "ftp://x", "payload": 1}])
    assert refused.value.status == 422 and refused.value.field == "jobs[0].endpoint"
