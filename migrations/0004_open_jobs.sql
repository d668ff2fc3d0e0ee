-- spindle JobDB, schema version 4: what a new owner reads is bounded by the open work, not by
-- the history.
--
-- A Director taking a JobDB over must find the jobs its predecessor left unfinished, read the
-- waiting ones in by pages and continue numbering transitions after the last one. Over the
-- history alone each of these scans every transition ever written (the key is (job_id, id)),
-- so a takeover grew with the JobDB. `open_jobs` holds each unfinished job's latest resting
-- state, written in the same transaction as its transition (inserted with the job, replaced by
-- each later row but `executing`, deleted by the terminal one): it is as large as the work in
-- progress. An attempt under way is the one row that may follow a job's entry (its start is
-- not written here, to keep the hot path light); readers that need it look for a row after
-- `transition_id`. The history stays the record; `open_jobs` can be rebuilt from it with the
-- INSERT below.

-- MAX(id) from an index instead of a scan of the whole table.
ALTER TABLE job_state_transitions ADD KEY job_state_transitions_id (id);

CREATE TABLE open_jobs (
  job_id        BINARY(16)        NOT NULL,
  transition_id BIGINT UNSIGNED   NOT NULL COMMENT 'its latest row but an executing one',
  state         ENUM('awaiting-scheduling', 'executing', 'succeeded', 'discarded',
                     'awaiting-retry', 'archiving', 'archived', 'moved') NOT NULL
                                  COMMENT 'never a terminal state: those rows are deleted',
  attempts      SMALLINT UNSIGNED NOT NULL,
  retry_at      DATETIME(6)       NULL COMMENT 'next attempt, for awaiting-retry',
  expire_at     DATETIME(6)       NULL COMMENT 'the job''s expire_at (jobs.expire_at)',
  PRIMARY KEY (job_id),
  KEY open_jobs_state_retry (state, retry_at),
  KEY open_jobs_expiry (expire_at)
) ENGINE = InnoDB;

INSERT INTO open_jobs (job_id, transition_id, state, attempts, retry_at, expire_at)
SELECT t.job_id, t.id, t.state, t.attempts, t.retry_at, j.expire_at
FROM job_state_transitions t
JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last
  ON last.job_id = t.job_id AND last.id = t.id
JOIN jobs j ON j.id = t.job_id
WHERE t.state NOT IN ('succeeded', 'discarded', 'archived', 'moved');
