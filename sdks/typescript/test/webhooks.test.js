// The receiver-side check agrees with the standardwebhooks package (npm) on shared vectors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Webhook, WebhookVerificationError as TheirError } from "standardwebhooks";
import { sign, verify, WebhookVerificationError } from "../src/index.js";
import { vectors } from "./helpers.js";

const headers = (v) => ({ "webhook-id": v.id, "webhook-timestamp": String(v.timestamp), "webhook-signature": v.signature });

test("every vector is judged as stated", () => {
  for (const v of vectors) {
    const check = () => verify(v.secret, headers(v), v.body, { now: v.now });
    if (v.valid) check();
    else assert.throws(check, WebhookVerificationError, v.why);
  }
});

test("the standardwebhooks package judges them alike", (t) => {
  for (const v of vectors) {
    t.mock.timers.enable({ apis: ["Date"], now: v.now * 1000 });
    let theirs = true;
    try {
      new Webhook(v.secret).verify(v.body, headers(v));
    } catch (e) {
      // It parses the body as JSON once the signature passed.
      theirs = !(e instanceof TheirError);
    }
    t.mock.timers.reset();
    assert.equal(theirs, v.valid, v.why);
  }
});

test("sign makes the package's signatures", () => {
  for (const v of vectors.filter((v) => v.why === "signed by the secret")) {
    assert.equal(sign(v.secret, v.id, v.timestamp, v.body), v.signature);
  }
});

test("a rotated secret, and a missing header", () => {
  const [old, fresh] = [1, 2].map((n) => `whsec_${Buffer.alloc(32, n).toString("base64")}`);
  const body = '{"a":1}';
  const h = { "Webhook-Id": "m1", "Webhook-Timestamp": "1000", "Webhook-Signature": sign(old, "m1", 1000, body) };
  assert.deepEqual(verify([fresh, old], h, body, { now: 1000 }), { a: 1 });
  assert.throws(() => verify(fresh, h, body, { now: 1000 }), WebhookVerificationError);
  assert.throws(() => verify(old, { "webhook-id": "m1", "webhook-timestamp": "1000" }, body, { now: 1000 }), /webhook-signature/);
});
