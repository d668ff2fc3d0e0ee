// Types of the hand-written layer; the API's own types are generated (schema.d.ts).
import type { components, paths } from "./schema.js";

export type { components, paths } from "./schema.js";
export type Schemas = components["schemas"];

/** A job as `POST /v1/jobs` takes it; `idempotency_key` is added when missing. */
export type NewJob = Schemas["JobSpec"];
/** An event as `POST /v1/events` takes it; `idempotency_key` is added when missing. */
export type NewEvent = Schemas["NewEvent"];

export declare const MAX_RETRY_WAIT: number;
export declare const DEFAULT_TOLERANCE: number;

export declare class SpindleError extends Error {
  status?: number;
  code?: string;
  field?: string;
  detail: string;
}
export declare class Refused extends SpindleError {}
export declare class Unavailable extends SpindleError {}
export declare class OutcomeUnknown extends SpindleError {
  /** The idempotency keys the request carried: send it again with them. */
  keys: string[];
}
export declare class WebhookVerificationError extends Error {}

/** Filters and cursor of `GET /v1/jobs`. */
export type JobQuery = Omit<NonNullable<paths["/v1/jobs"]["get"]["parameters"]["query"]>, "created_after" | "created_before"> & {
  created_after?: string | Date;
  created_before?: string | Date;
};
/** Filters and cursor of `GET /v1/events`. */
export type EventQuery = Omit<NonNullable<paths["/v1/events"]["get"]["parameters"]["query"]>, "created_after" | "created_before"> & {
  created_after?: string | Date;
  created_before?: string | Date;
};

export interface SpindleOptions {
  token?: string;
  retries?: number;
  backoff?: number;
  maxBackoff?: number;
  timeout?: number;
  fetch?: typeof fetch;
  sleep?: (seconds: number) => Promise<void>;
}

export declare class Spindle {
  constructor(baseUrl: string, options?: SpindleOptions);
  submit(jobs: NewJob[]): Promise<Schemas["SubmitResponse"]>;
  publish(event: NewEvent): Promise<Schemas["PublishReply"]>;
  publish(events: NewEvent[]): Promise<Schemas["PublishBatchReply"]>;
  job(id: string): Promise<Schemas["JobView"]>;
  attempts(id: string): Promise<Schemas["AttemptList"]>;
  jobsPage(query?: JobQuery): Promise<Schemas["JobList"]>;
  jobs(query?: Omit<JobQuery, "limit"> & { limit?: number }): AsyncGenerator<Schemas["JobDescription"]>;
  eventsPage(query?: EventQuery): Promise<Schemas["EventList"]>;
  events(query?: EventQuery): AsyncGenerator<Schemas["EventView"]>;
  addSubscription(spec: Schemas["NewSubscription"]): Promise<Schemas["SubscriptionView"]>;
  subscriptions(bucket?: string): Promise<Schemas["SubscriptionList"]>;
  subscription(id: string): Promise<Schemas["SubscriptionView"]>;
  updateSubscription(id: string, change: Schemas["SubscriptionPatch"], version?: number): Promise<Schemas["SubscriptionView"]>;
  removeSubscription(id: string): Promise<Schemas["SubscriptionView"]>;
  backfill(id: string, events: Schemas["PastEvent"][]): Promise<Schemas["BackfillReply"]>;
}

export declare function sign(secret: string, msgId: string, timestamp: number | string, body: string | Uint8Array): string;
export declare function verify(
  secrets: string | string[],
  headers: Headers | Record<string, string | string[] | undefined>,
  body: string | Uint8Array,
  options?: { tolerance?: number; now?: number },
): unknown;
