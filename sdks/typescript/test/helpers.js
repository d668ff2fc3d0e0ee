// A local receiver for the tests: records every request, answers from a script (a list of
// [status, headers, body] taken in turn; then 200).
import { createServer } from "node:http";
import { readFileSync } from "node:fs";

export const vectors = JSON.parse(readFileSync(new URL("../../webhook-vectors.json", import.meta.url))).vectors;

export async function receiver() {
  const requests = [];
  const script = [];
  const waiters = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      requests.push({ method: req.method, path: req.url, headers: req.headers, body: Buffer.concat(chunks) });
      const [status, headers, body] = script.shift() ?? [200, {}, ""];
      res.writeHead(status, headers);
      res.end(body);
      for (const w of waiters.splice(0)) w();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  async function wait(count, prefix = "", timeoutMs = 30000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const got = requests.filter((r) => r.path.startsWith(prefix));
      if (got.length >= count) return got;
      if (Date.now() > deadline) throw new Error(`waited for ${count} requests to ${prefix}`);
      await new Promise((r) => {
        waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }
  return { url, requests, script, wait, close: () => new Promise((r) => server.close(r)) };
}

export function error(code, message, field) {
  return JSON.stringify({ error: { code, message, field } });
}
