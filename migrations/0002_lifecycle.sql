-- spindle JobDB, schema version 2: what the JobDB lifecycle needs.
--
-- A retired JobDB's drainer moves jobs that still await a retry into a live JobDB, and jobs
-- that expired (here or in a live JobDB) are archived to S3 in batches. Both are planned in
-- this database before they happen, so a process killed half way finds its plan and finishes
-- it instead of doing the work twice. Rows are still only appended.

-- A job moved out of this JobDB ends here in `moved`; its history continues in `job_moves.to_jobdb`.
ALTER TABLE job_state_transitions
  MODIFY state ENUM('awaiting-scheduling', 'executing', 'succeeded', 'discarded',
                    'awaiting-retry', 'archiving', 'archived', 'moved') NOT NULL;

-- Jobs imported from a retired JobDB: where they came from (their earlier trace is archived
-- under that JobDB's name, kind `history`).
CREATE TABLE job_origins (
  job_id      BINARY(16)  NOT NULL,
  from_jobdb  VARCHAR(64) CHARACTER SET ascii NOT NULL,
  imported_at DATETIME(6) NOT NULL,
  PRIMARY KEY (job_id)
) ENGINE = InnoDB;

-- The drainer's plan: this job goes to that JobDB, in that import batch. Written before the
-- import is sent; the job's `moved` transition records that the import was confirmed. A job's
-- plan with the highest batch id is its current one (a plan whose target JobDB retired before
-- taking the job is replaced by a new one).
CREATE TABLE job_moves (
  job_id     BINARY(16)  NOT NULL,
  batch_id   BINARY(16)  NOT NULL,
  to_jobdb   VARCHAR(64) CHARACTER SET ascii NOT NULL,
  planned_at DATETIME(6) NOT NULL,
  PRIMARY KEY (job_id, batch_id),
  KEY job_moves_batch (batch_id)
) ENGINE = InnoDB;

-- Archive batches: one S3 object (plus manifest) each, planned before the upload so that a
-- retried upload writes the same object with the same jobs. `expired`: jobs that expired
-- (their `archived` row follows the confirmation). `history`: the whole trace of every other
-- job of a drained JobDB (succeeded, discarded, moved), kept before the JobDB is dropped.
CREATE TABLE archive_batches (
  batch_id   BINARY(16)    NOT NULL,
  kind       ENUM('expired', 'history') NOT NULL,
  object_key VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  planned_at DATETIME(6)   NOT NULL,
  PRIMARY KEY (batch_id)
) ENGINE = InnoDB;

-- Which batch holds a job: a job is in at most one batch of each kind.
CREATE TABLE archive_batch_jobs (
  job_id   BINARY(16) NOT NULL,
  kind     ENUM('expired', 'history') NOT NULL,
  batch_id BINARY(16) NOT NULL,
  PRIMARY KEY (job_id, kind),
  KEY archive_batch_jobs_batch (batch_id)
) ENGINE = InnoDB;

-- Batches whose object and manifest S3 confirmed, with the object's SHA-256.
CREATE TABLE archive_confirmations (
  batch_id     BINARY(16)  NOT NULL,
  sha256       CHAR(64)    CHARACTER SET ascii NOT NULL,
  confirmed_at DATETIME(6) NOT NULL,
  PRIMARY KEY (batch_id)
) ENGINE = InnoDB;
