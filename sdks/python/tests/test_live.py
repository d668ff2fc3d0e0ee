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
    producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    reply = spindle.submit([{**job, "traceparent": producer}])
    job_id = reply.jobs[0].id
    view = wait_state(spindle, job_id, "succeeded")
    assert view.traceparent == producer
    [(method, path, headers, body)] = receiver.wait(1, "/jobs")
    assert (method, body) == ("POST", b'{"from":"python"}')
    assert headers["spindle-job-id"] == job_id
    # The receiver's trace continues the attempt's span (a trace of its own, not the producer's).
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert trace_id != producer.split("-")[1]
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


def test_a_batch_an_edit_and_a_backfill(router_url, receiver):
    spindle = Spindle(router_url)
    bucket = f"py-{uuid.uuid4().hex[:8]}"
    sub = spindle.add_subscription({"bucket": bucket, "url": receiver.url + "/late", "event_types": ["a.*"], "enabled": False})
    # An edit from a stale version is refused; from the current one it holds.
    with pytest.raises(Refused) as stale:
        spindle.update_subscription(sub.id, {"event_types": ["b.*"]}, version=sub.version + 7)
    assert stale.value.status == 412
    edited = spindle.update_subscription(sub.id, {"event_types": ["a.*", "b.*"]}, version=sub.version)
    assert edited.event_types == ["a.*", "b.*"] and edited.enabled is False
    time.sleep(2.5)
    batch = spindle.publish([{"bucket": bucket, "event_type": t, "payload": {"t": t}} for t in ("a.x", "b.y", "c.z")])
    assert [len(e.deliveries) for e in batch.events] == [1, 1, 0]
    # Back-fill a past event the subscription never had: delivered once when it is enabled.
    past = {"event_id": "01JDQ2Z7XW3V4Y5N6P7R8S9T0A", "event_type": "a.old",
            "timestamp": "2026-11-01T00:00:00Z", "data": {"old": True}}
    filled = spindle.backfill(sub.id, [past])
    again = spindle.backfill(sub.id, [past])
    assert len(filled.deliveries) == 1 and len(again.deliveries) == 0 and again.skipped == 1
    spindle.update_subscription(sub.id, {"enabled": True})
    arrived = receiver.wait(3, "/late")
    kinds = sorted(verify(sub.secret, h, b)["type"] for _, _, h, b in arrived)
    assert kinds == ["a.old", "a.x", "b.y"]


def test_jobs_listed_by_bucket_page_after_page(router_url, receiver):
    spindle = Spindle(router_url)
    bucket = f"pylist-{uuid.uuid4().hex[:8]}"
    jobs = [{"bucket": bucket, "endpoint": receiver.url + "/listed"} for _ in range(5)]
    ids = [j.id for j in spindle.submit(jobs).jobs]
    for job_id in ids:
        wait_state(spindle, job_id, "succeeded")
    listed = [j.id for j in spindle.jobs(bucket=bucket, order="oldest", page_size=2)]
    assert listed == ids
    page = spindle.jobs_page(bucket=bucket, limit=2)
    assert [j.id for j in page.jobs] == ids[::-1][:2] and page.next_after == ids[3]
    assert list(spindle.jobs(bucket=bucket, state="discarded")) == []
    [attempt] = spindle.attempts(ids[0]).attempts
    assert (attempt.attempt, attempt.response_status, str(attempt.outcome)) == (1, 200, "succeeded")
    with pytest.raises(Refused) as refused:
        spindle.jobs_page(bucket=bucket, state="finished")
    assert refused.value.field == "state"
