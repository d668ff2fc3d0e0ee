-- spindle JobDB (SQLite), schema version 12: jobs and events can be listed by their filters.
-- See migrations/0012_listing.sql for the meaning.

CREATE INDEX jobs_bucket ON jobs (bucket, id);
CREATE INDEX jobs_ordering_key ON jobs (ordering_key, id);
CREATE INDEX events_bucket ON events (bucket, id);
