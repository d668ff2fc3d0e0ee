// Against a live router and Director (tests/sdks.rs starts them and sets the variables): a
// job through the router reaches its endpoint; a repeat of its key is a duplicate; an event
// arrives signed so `verify` accepts it; a bad field is refused naming it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { Refused, Spindle, verify } from "../src/index.js";
import { receiver } from "./helpers.js";

const router = process.env.SPINDLE_ROUTER_URL;
const director = process.env.SPINDLE_DIRECTOR_URL;
const live = { skip: !router || !director ? "SPINDLE_ROUTER_URL and SPINDLE_DIRECTOR_URL are not set" : false };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitState(spindle, id, state) {
  for (let i = 0; i < 300; i++) {
    if ((await spindle.job(id)).state === state) return;
    await sleep(100);
  }
  assert.fail(`job ${id} did not reach ${state}`);
}

test("a job through the router is delivered once", live, async () => {
  const r = await receiver();
  const spindle = new Spindle(router);
  const bucket = `ts-${randomUUID().slice(0, 8)}`;
  const job = { bucket, endpoint: `${r.url}/jobs`, payload: { from: "typescript" } };
  const reply = await spindle.submit([job]);
  const id = reply.jobs[0].id;
  await waitState(spindle, id, "succeeded");
  const [got] = await r.wait(1, "/jobs");
  assert.equal(got.body.toString(), '{"from":"typescript"}');
  assert.equal(got.headers["spindle-job-id"], id);
  const keyed = { ...job, idempotency_key: `fixed-${bucket}` };
  const first = await spindle.submit([keyed]);
  const repeat = await spindle.submit([keyed]);
  assert.equal(repeat.jobs[0].id, first.jobs[0].id);
  assert.equal(repeat.jobs[0].status, "duplicate");
  await r.close();
});

test("an event arrives signed for its subscription", live, async () => {
  const r = await receiver();
  const spindle = new Spindle(router);
  const bucket = `ts-${randomUUID().slice(0, 8)}`;
  const sub = await spindle.addSubscription({ bucket, url: `${r.url}/events`, event_types: ["order.*"] });
  const listed = await spindle.subscriptions(bucket);
  assert.ok(listed.subscriptions.some((s) => s.id === sub.id));
  // Routers and Directors read a new subscription from the control database within ~1 s.
  await sleep(2500);
  const reply = await spindle.publish({ bucket, event_type: "order.paid", payload: { n: 7 } });
  assert.equal(reply.deliveries.length, 1);
  const [got] = await r.wait(1, "/events");
  const envelope = verify(sub.secret, got.headers, got.body);
  assert.equal(envelope.type, "order.paid");
  assert.deepEqual(envelope.data, { n: 7 });
  assert.throws(() => verify(`whsec_${"A".repeat(32)}`, got.headers, got.body));
  await spindle.removeSubscription(sub.id);
  await r.close();
});

test("a bad field is refused by name", live, async () => {
  const spindle = new Spindle(director);
  await assert.rejects(
    spindle.submit([{ bucket: "b", endpoint: "ftp://x", payload: 1 }]),
    (e) => e instanceof Refused && e.status === 422 && e.field === "jobs[0].endpoint",
  );
});

test("a batch, an edit and a back-fill", live, async () => {
  const r = await receiver();
  const spindle = new Spindle(router);
  const bucket = `ts-${randomUUID().slice(0, 8)}`;
  const sub = await spindle.addSubscription({ bucket, url: `${r.url}/late`, event_types: ["a.*"], enabled: false });
  // An edit from a stale version is refused; from the current one it holds.
  await assert.rejects(spindle.updateSubscription(sub.id, { event_types: ["b.*"] }, sub.version + 7), (e) => e instanceof Refused && e.status === 412);
  const edited = await spindle.updateSubscription(sub.id, { event_types: ["a.*", "b.*"] }, sub.version);
  assert.deepEqual(edited.event_types, ["a.*", "b.*"]);
  assert.equal(edited.enabled, false);
  await sleep(2500);
  const batch = await spindle.publish(["a.x", "b.y", "c.z"].map((t) => ({ bucket, event_type: t, payload: { t } })));
  assert.deepEqual(batch.events.map((e) => e.deliveries.length), [1, 1, 0]);
  // Back-fill a past event the subscription never had: delivered once when it is enabled.
  const past = { event_id: "01JDQ2Z7XW3V4Y5N6P7R8S9T0A", event_type: "a.old", timestamp: "2026-11-01T00:00:00Z", data: { old: true } };
  const filled = await spindle.backfill(sub.id, [past]);
  const again = await spindle.backfill(sub.id, [past]);
  assert.equal(filled.deliveries.length, 1);
  assert.equal(again.deliveries.length, 0);
  assert.equal(again.skipped, 1);
  await spindle.updateSubscription(sub.id, { enabled: true });
  const arrived = await r.wait(3, "/late");
  const kinds = arrived.map((a) => verify(sub.secret, a.headers, a.body).type).sort();
  assert.deepEqual(kinds, ["a.old", "a.x", "b.y"]);
  await r.close();
});

test("jobs listed by bucket, page after page", live, async () => {
  const r = await receiver();
  const spindle = new Spindle(router);
  const bucket = `tslist-${randomUUID().slice(0, 8)}`;
  const reply = await spindle.submit(Array.from({ length: 5 }, () => ({ bucket, endpoint: `${r.url}/listed` })));
  const ids = reply.jobs.map((j) => j.id);
  for (const id of ids) await waitState(spindle, id, "succeeded");
  const listed = [];
  for await (const job of spindle.jobs({ bucket, order: "oldest", limit: 2 })) listed.push(job.id);
  assert.deepEqual(listed, ids);
  const page = await spindle.jobsPage({ bucket, limit: 2 });
  assert.deepEqual(page.jobs.map((j) => j.id), ids.slice().reverse().slice(0, 2));
  assert.equal(page.next_after, ids[3]);
  const { attempts } = await spindle.attempts(ids[0]);
  assert.equal(attempts.length, 1);
  assert.equal(attempts[0].response_status, 200);
  await assert.rejects(spindle.jobsPage({ bucket, state: "finished" }), (e) => e instanceof Refused && e.field === "state");
  await r.close();
});
