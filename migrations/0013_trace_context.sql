-- spindle JobDB, schema version 13: a job keeps the trace it was submitted in.
--
-- `traceparent` and `tracestate` are the W3C trace context of the producer's span, as given
-- on submit or publish (the request's headers, or the job's own fields). Each attempt is a
-- trace of its own linked to that span, so the columns move with the job (drains, imports)
-- and go into the archive with it. NULL: the job was submitted in no trace.

ALTER TABLE jobs
  ADD COLUMN traceparent CHAR(55) CHARACTER SET ascii COLLATE ascii_bin NULL,
  ADD COLUMN tracestate VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin NULL;
