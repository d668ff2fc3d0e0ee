// Type-checked only (`tsc -p .`): the hand-written types agree with the generated ones.
import { Spindle, verify, type NewJob } from "../src/index.js";

const job: NewJob = { bucket: "acme", endpoint: "https://example.com/hook", payload: { n: 1 } };
export async function example(): Promise<string> {
  const spindle = new Spindle("http://localhost:8070", { retries: 3 });
  const reply = await spindle.submit([job]);
  const first = reply.jobs[0];
  const view = await spindle.job(first.id);
  verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", { "webhook-id": "x" }, "{}");
  return view.state;
}
