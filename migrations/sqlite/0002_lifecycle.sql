-- spindle JobDB on SQLite, schema version 2: the lifecycle's tables (see migrations/0002).

CREATE TABLE job_origins (
  job_id      BLOB NOT NULL PRIMARY KEY,
  from_jobdb  TEXT NOT NULL,
  imported_at TEXT NOT NULL
);

CREATE TABLE job_moves (
  job_id     BLOB NOT NULL,
  batch_id   BLOB NOT NULL,
  to_jobdb   TEXT NOT NULL,
  planned_at TEXT NOT NULL,
  PRIMARY KEY (job_id, batch_id)
) WITHOUT ROWID;
CREATE INDEX job_moves_batch ON job_moves (batch_id);

CREATE TABLE archive_batches (
  batch_id   BLOB NOT NULL PRIMARY KEY,
  kind       TEXT NOT NULL CHECK (kind IN ('expired', 'history')),
  object_key TEXT NOT NULL,
  planned_at TEXT NOT NULL
);

CREATE TABLE archive_batch_jobs (
  job_id   BLOB NOT NULL,
  kind     TEXT NOT NULL CHECK (kind IN ('expired', 'history')),
  batch_id BLOB NOT NULL,
  PRIMARY KEY (job_id, kind)
) WITHOUT ROWID;
CREATE INDEX archive_batch_jobs_batch ON archive_batch_jobs (batch_id);

CREATE TABLE archive_confirmations (
  batch_id     BLOB NOT NULL PRIMARY KEY,
  sha256       TEXT NOT NULL,
  confirmed_at TEXT NOT NULL
);
