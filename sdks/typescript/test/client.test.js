// What the hand-written layer adds, against a scripted server: idempotency keys kept across
// retries, `503` retried after `Retry-After`, a `4xx` never, `504` reported as unknown.
import { test } from "node:test";
import assert from "node:assert/strict";
import { OutcomeUnknown, Refused, Spindle, Unavailable } from "../src/index.js";
import { error, receiver } from "./helpers.js";

const ACCEPTED = JSON.stringify({ transaction_id: "1", jobs: [{ id: "01JDQ2Z7XW3V4Y5N6P7R8S9T0A", bucket: "b" }] });
const JOB = { bucket: "b", endpoint: "https://example.com/hook", payload: { n: 1 } };
const json = { "content-type": "application/json" };
const keysSent = (r) => r.requests.map((q) => JSON.parse(q.body).jobs.map((j) => j.idempotency_key));

test("a 503 is retried as told, with the same keys", async () => {
  const r = await receiver();
  r.script.push([503, { ...json, "retry-after": "2" }, error("unavailable", "down")], [503, json, error("unavailable", "down")], [202, json, ACCEPTED]);
  const waits = [];
  const spindle = new Spindle(r.url, { backoff: 0.5, sleep: async (s) => waits.push(s) });
  const reply = await spindle.submit([JOB, { ...JOB }]);
  assert.equal(reply.jobs[0].id, "01JDQ2Z7XW3V4Y5N6P7R8S9T0A");
  const sent = keysSent(r);
  assert.equal(sent.length, 3);
  assert.deepEqual(sent[1], sent[0]);
  assert.deepEqual(sent[2], sent[0]);
  assert.equal(new Set(sent[0]).size, 2);
  assert.equal(waits[0], 2);
  assert.ok(waits[1] >= 0.25 && waits[1] <= 1);
  await r.close();
});

test("a 4xx is never retried", async () => {
  const r = await receiver();
  r.script.push([422, json, error("invalid_field", "is not a valid URL", "jobs[0].endpoint")]);
  const spindle = new Spindle(r.url, { sleep: async () => {} });
  await assert.rejects(spindle.submit([{ ...JOB, idempotency_key: "k1" }]), (e) => e instanceof Refused && e.status === 422 && e.field === "jobs[0].endpoint");
  assert.deepEqual(keysSent(r), [["k1"]]);
  await r.close();
});

test("a 504 is an unknown outcome, with its keys", async () => {
  const r = await receiver();
  r.script.push([504, json, error("unavailable", "the write timed out")]);
  const spindle = new Spindle(r.url, { sleep: async () => {} });
  await assert.rejects(spindle.publish({ bucket: "b", event_type: "x", payload: {} }), (e) => {
    assert.ok(e instanceof OutcomeUnknown);
    assert.deepEqual(e.keys, [JSON.parse(r.requests[0].body).idempotency_key]);
    return true;
  });
  assert.equal(r.requests.length, 1);
  await r.close();
});

test("a 503 past the retries is unavailable", async () => {
  const r = await receiver();
  for (let i = 0; i < 3; i++) r.script.push([503, { ...json, "retry-after": "0" }, error("unavailable", "down")]);
  const spindle = new Spindle(r.url, { retries: 2, sleep: async () => {} });
  await assert.rejects(spindle.submit([JOB]), Unavailable);
  assert.equal(r.requests.length, 3);
  await r.close();
});

test("a server that refuses connections is tried again, then unavailable", async () => {
  const r = await receiver();
  const url = r.url;
  await r.close();
  const waits = [];
  const spindle = new Spindle(url, { retries: 2, sleep: async (s) => waits.push(s) });
  await assert.rejects(spindle.submit([JOB]), Unavailable);
  assert.equal(waits.length, 2);
});
