-- spindle JobDB on SQLite, schema version 1: the same tables as the MySQL schema in
-- `migrations/` (read its comments), in SQLite's types. One JobDB is one file.
--
-- Times are TEXT in sqlx's format ('YYYY-MM-DD HH:MM:SS.ffffff', UTC), which sorts as it
-- compares. Ids are 16-byte BLOBs (hex(id) prints the 32-digit form). SQLite cannot change a
-- CHECK later, so `state` admits from the start what MySQL's version 2 added (`moved`).

CREATE TABLE jobs (
  id                   BLOB    NOT NULL PRIMARY KEY,
  bucket               TEXT    NOT NULL,
  endpoint             TEXT    NOT NULL,
  method               TEXT    NOT NULL,
  headers              TEXT    NOT NULL,
  payload              BLOB    NOT NULL,
  execution_timeout_ms INTEGER NOT NULL,
  backoff_min_delay_ms INTEGER NOT NULL,
  backoff_coefficient  REAL    NOT NULL,
  created_at           TEXT    NOT NULL,
  expire_at            TEXT    NOT NULL,
  idempotency_key      TEXT    NULL
);

-- Small rows under a two-column key: stored in key order (like InnoDB's clustered index).
CREATE TABLE job_state_transitions (
  id                      INTEGER NOT NULL,
  job_id                  BLOB    NOT NULL,
  time                    TEXT    NOT NULL,
  retry_at                TEXT    NULL,
  attempts                INTEGER NOT NULL,
  state                   TEXT    NOT NULL CHECK (state IN ('awaiting-scheduling', 'executing',
                            'succeeded', 'discarded', 'awaiting-retry', 'archiving', 'archived',
                            'moved')),
  error_type              TEXT    NULL,
  error_response          BLOB    NULL,
  error_response_encoding TEXT    NULL,
  response_status         INTEGER NULL,
  duration_ms             INTEGER NULL,
  PRIMARY KEY (job_id, id)
) WITHOUT ROWID;

CREATE TABLE jobdb_owner (
  id            INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  fencing_token INTEGER NOT NULL,
  holder        TEXT    NOT NULL,
  acquired_at   TEXT    NULL
);

INSERT INTO jobdb_owner (id, fencing_token, holder, acquired_at) VALUES (1, 0, '', NULL);

CREATE VIEW job_latest AS
SELECT t.*
FROM job_state_transitions t
JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last
  ON last.job_id = t.job_id AND last.id = t.id;
