// Receiving deliveries: Standard Webhooks signatures (https://www.standardwebhooks.com).
// A delivery carries `webhook-id`, `webhook-timestamp` (Unix seconds) and `webhook-signature`:
// space-separated `v1,<base64 HMAC-SHA256>` entries (several while a secret rotates) over
// `{id}.{timestamp}.{body}`, keyed by the base64 after `whsec_` in the subscription's secret.
import { createHmac, timingSafeEqual } from "node:crypto";

/** How far a delivery's timestamp may be from now, in seconds, either way. */
export const DEFAULT_TOLERANCE = 5 * 60;

/** A delivery that is not signed by any of the given secrets, or not now. */
export class WebhookVerificationError extends Error {
  constructor(message) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

function key(secret) {
  const text = secret.startsWith("whsec_") ? secret.slice(6) : secret;
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0) {
    throw new WebhookVerificationError("the secret is not whsec_ followed by base64");
  }
  return Buffer.from(text, "base64");
}

function bytes(body) {
  return typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
}

/** The `v1,<signature>` entry a sender puts in `webhook-signature`. */
export function sign(secret, msgId, timestamp, body) {
  const mac = createHmac("sha256", key(secret));
  mac.update(`${msgId}.${timestamp}.`);
  mac.update(bytes(body));
  return `v1,${mac.digest("base64")}`;
}

function header(headers, name) {
  if (typeof headers.get === "function") return headers.get(name) ?? undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name) return Array.isArray(v) ? v[0] : v;
  }
  return undefined;
}

/**
 * Checks a delivery and returns its body as JSON (or the raw bytes when it is not JSON).
 * `secrets`: the subscription's secret, or several while one is rotated out. `headers`: a
 * `Headers` or a plain object (any case). Throws `WebhookVerificationError` when a header is
 * missing, the timestamp is more than `tolerance` seconds from now, or no signature matches.
 */
export function verify(secrets, headers, body, { tolerance = DEFAULT_TOLERANCE, now } = {}) {
  const id = header(headers, "webhook-id");
  const stamp = header(headers, "webhook-timestamp");
  const given = header(headers, "webhook-signature");
  for (const [name, value] of [["webhook-id", id], ["webhook-timestamp", stamp], ["webhook-signature", given]]) {
    if (value === undefined) throw new WebhookVerificationError(`missing header ${name}`);
  }
  if (!/^-?[0-9]+$/.test(stamp)) throw new WebhookVerificationError("webhook-timestamp is not an integer");
  const timestamp = Number(stamp);
  const current = now ?? Date.now() / 1000;
  if (Math.abs(current - timestamp) > tolerance) {
    throw new WebhookVerificationError("webhook-timestamp is too far from now");
  }
  const raw = bytes(body);
  const expected = (Array.isArray(secrets) ? secrets : [secrets]).map((s) => Buffer.from(sign(s, id, stamp, raw)));
  for (const entry of given.split(" ")) {
    const got = Buffer.from(entry);
    if (expected.some((e) => e.length === got.length && timingSafeEqual(e, got))) {
      try {
        return JSON.parse(raw.toString("utf8"));
      } catch {
        return raw;
      }
    }
  }
  throw new WebhookVerificationError("no signature matches");
}
