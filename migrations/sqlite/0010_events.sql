-- spindle JobDB (SQLite), schema version 10: events and subscriptions. See
-- migrations/0010_events.sql for the meaning.

ALTER TABLE jobs ADD COLUMN event_id BLOB NULL;
ALTER TABLE jobs ADD COLUMN event_type TEXT NULL;
ALTER TABLE jobs ADD COLUMN subscription_id BLOB NULL;
CREATE INDEX jobs_event ON jobs (event_id, subscription_id);

CREATE TABLE events (
  id         BLOB NOT NULL PRIMARY KEY,
  bucket     TEXT NOT NULL,
  event_type TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE INDEX events_type ON events (bucket, event_type, id);
