-- spindle JobDB (SQLite), schema version 13: a job keeps the trace it was submitted in.
-- See migrations/0013_trace_context.sql for the meaning.

ALTER TABLE jobs ADD COLUMN traceparent TEXT NULL;
ALTER TABLE jobs ADD COLUMN tracestate TEXT NULL;
