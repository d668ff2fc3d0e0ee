-- spindle JobDB (SQLite), schema version 14: erasure. See the MySQL migration of the same
-- number for what the columns mean.

ALTER TABLE operator_commands ADD COLUMN idempotency_key_prefix TEXT NULL;
ALTER TABLE jobs ADD COLUMN erased_at TEXT NULL;
ALTER TABLE events ADD COLUMN erased_at TEXT NULL;
