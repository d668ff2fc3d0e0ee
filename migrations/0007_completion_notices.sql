-- spindle JobDB, schema version 7: completion notices.
--
-- A job may name an `on_complete` URL: when it ends (succeeded, discarded or archived), spindle
-- delivers a small JSON notice of how it ended to that URL, as a job of its own with its own
-- retries. The notice job is written in the same transaction as the row that ends the job, so
-- a notice is never lost and never sent twice for one ending.
--
-- `notices_owed` lists the jobs that name an `on_complete` URL and have not ended yet: the
-- writer looks up the jobs that end in a transaction there (a small table, usually empty),
-- not in `jobs`, so jobs without a notice cost next to nothing. A row is written with its
-- job and deleted with the notice job's insert.

ALTER TABLE jobs
  ADD COLUMN on_complete VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    COMMENT 'URL told when the job ends (its notice is a job of its own)';

CREATE TABLE notices_owed (
  job_id BINARY(16) NOT NULL,
  PRIMARY KEY (job_id)
) ENGINE = InnoDB;
