-- spindle JobDB (SQLite), schema version 11: every published event is kept. See
-- migrations/0011_event_payloads.sql for the meaning.

ALTER TABLE events ADD COLUMN payload BLOB NULL;
