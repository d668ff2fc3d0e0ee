-- spindle JobDB on SQLite, schema version 8: ordered delivery per key (read the MySQL
-- migration's comments).

ALTER TABLE jobs ADD COLUMN ordering_key TEXT NULL;
ALTER TABLE jobs ADD COLUMN ordering_blocks INTEGER NOT NULL DEFAULT 0;

ALTER TABLE open_jobs ADD COLUMN seq BLOB NULL;
ALTER TABLE open_jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;

CREATE INDEX open_jobs_seq ON open_jobs (seq, held, job_id);

CREATE TABLE ordering_blocked (
  seq        BLOB NOT NULL PRIMARY KEY,
  job_id     BLOB NOT NULL,
  state      TEXT NOT NULL,
  blocked_at TEXT NOT NULL
) WITHOUT ROWID;
