-- spindle JobDB, schema version 12: jobs and events can be listed by their filters.
--
-- `GET /v1/jobs` and `GET /v1/events` read pages in id order (ids are ULIDs: creation order).
-- Each filter that selects a narrow part of a large JobDB has an index that yields its rows in
-- id order, so a page reads a bounded range instead of scanning the table: a bucket's jobs,
-- an ordering key's jobs, a bucket's events (of one type: `events_type`, already there).
-- Other filters (endpoint, state, exact creation times) are checked within a bounded window
-- of the rows these ranges give (docs/operations.md, "Listing jobs and events").

ALTER TABLE jobs
  ADD KEY jobs_bucket (bucket, id),
  ADD KEY jobs_ordering_key (ordering_key, id);

ALTER TABLE events
  ADD KEY events_bucket (bucket, id);
