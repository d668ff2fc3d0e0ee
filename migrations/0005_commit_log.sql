-- spindle JobDB, schema version 5: a delivered job costs its `jobs` row and the row of its
-- outcome, and `open_jobs` holds only jobs that rest.
--
-- Until now a delivered job wrote four rows (`awaiting-scheduling`, `executing`, its outcome,
-- and the job) and an `open_jobs` entry inserted and deleted again: most of a JobDB's work, for
-- a job that lives a few milliseconds. From this version:
-- - a job's `jobs` row is its acceptance: a submitted job gets no `awaiting-scheduling` row
--   (`job_history` shows one, at `created_at`);
-- - an attempt's start is recorded by the Director's commit that allows it (`commit_log`,
--   one row per group commit, listing the attempts it began) before the request is sent, and
--   the row that ends the attempt names that commit and time (`started_in`, `started_at`):
--   every request sent is in the history (`job_history` shows an `executing` row for each);
-- - a job enters `open_jobs` when it first rests (waits for a retry, is imported, or has
--   waited long without an attempt); until then it is found through the commit that accepted
--   it (`commit_log.accepted`).
-- `jobdb_checkpoint.open_from` bounds what a new owner reads: every `commit_log` row below it
-- has each job it accepted ended or in `open_jobs`, and each attempt it began ended.
-- `open_work` is every unfinished job with its state, read the same way by a new owner, a
-- drainer and an operator.

ALTER TABLE job_state_transitions
  ADD COLUMN started_in BIGINT UNSIGNED NULL COMMENT 'commit_log row that began the attempt this row ends',
  ADD COLUMN started_at DATETIME(6)     NULL COMMENT 'when that attempt began';

CREATE TABLE commit_log (
  id       BIGINT UNSIGNED NOT NULL COMMENT 'from the sequence of transition ids',
  time     DATETIME(6)     NOT NULL,
  accepted MEDIUMTEXT      CHARACTER SET ascii NULL
                           COMMENT 'JSON array of the HEX(id) of each job this commit accepted',
  started  MEDIUMTEXT      CHARACTER SET ascii NULL
                           COMMENT 'JSON array of [HEX(job id), attempt] for each attempt it began',
  PRIMARY KEY (id)
) ENGINE = InnoDB;

CREATE TABLE jobdb_checkpoint (
  id        TINYINT UNSIGNED NOT NULL,
  open_from BIGINT UNSIGNED  NOT NULL COMMENT 'commit_log rows below this id hold nothing open',
  PRIMARY KEY (id),
  CONSTRAINT jobdb_checkpoint_single_row CHECK (id = 1)
) ENGINE = InnoDB;

INSERT INTO jobdb_checkpoint (id, open_from) VALUES (1, 0);

-- Attempts begun and not ended: no row of the job follows the commit that began them.
CREATE VIEW attempts_under_way AS
SELECT UNHEX(s.job) AS job_id, c.id AS started_in, c.time AS started_at, s.attempt AS attempts
FROM jobdb_checkpoint k
JOIN commit_log c ON c.id >= k.open_from
JOIN JSON_TABLE(c.started, '$[*]' COLUMNS (job CHAR(32) PATH '$[0]', attempt SMALLINT UNSIGNED PATH '$[1]')) s
WHERE NOT EXISTS (SELECT 1 FROM job_state_transitions t
                  WHERE t.job_id = UNHEX(s.job) AND t.id > c.id);

-- Jobs accepted that have no row of their own and no `open_jobs` entry yet.
CREATE VIEW jobs_fresh AS
SELECT UNHEX(a.job) AS job_id, c.id AS accepted_in
FROM jobdb_checkpoint k
JOIN commit_log c ON c.id >= k.open_from
JOIN JSON_TABLE(c.accepted, '$[*]' COLUMNS (job CHAR(32) PATH '$')) a
WHERE NOT EXISTS (SELECT 1 FROM job_state_transitions t WHERE t.job_id = UNHEX(a.job))
  AND NOT EXISTS (SELECT 1 FROM open_jobs o WHERE o.job_id = UNHEX(a.job));

-- Every unfinished job and where it stands: resting (`open_jobs`, or the row that follows its
-- entry there), accepted and never tried, or with an attempt under way; `listed` says whether
-- it has its `open_jobs` entry.
CREATE VIEW open_work AS
SELECT b.job_id,
       CASE WHEN u.job_id IS NULL THEN b.state ELSE 'executing' END AS state,
       CAST(CASE WHEN u.job_id IS NULL THEN b.attempts ELSE u.attempts END AS UNSIGNED)
         AS attempts,
       CASE WHEN u.job_id IS NULL THEN b.retry_at END AS retry_at,
       u.started_in, u.started_at, b.listed
FROM (SELECT o.job_id, COALESCE(t.state, o.state) AS state,
             COALESCE(t.attempts, o.attempts) AS attempts,
             CASE WHEN t.id IS NULL THEN o.retry_at ELSE t.retry_at END AS retry_at,
             1 AS listed
      FROM open_jobs o
      LEFT JOIN job_state_transitions t ON t.job_id = o.job_id AND t.id > o.transition_id
      UNION ALL
      SELECT f.job_id, 'awaiting-scheduling', 0, CAST(NULL AS DATETIME(6)), 0 FROM jobs_fresh f) b
LEFT JOIN attempts_under_way u ON u.job_id = b.job_id;

-- Every job's whole story, oldest first (ORDER BY job_id, id): its acceptance, each attempt's
-- start, every row it has, and an attempt under way.
CREATE VIEW job_history AS
SELECT j.id AS job_id, CAST(0 AS UNSIGNED) AS id, j.created_at AS time,
       CAST(NULL AS DATETIME(6)) AS retry_at, CAST(0 AS UNSIGNED) AS attempts,
       'awaiting-scheduling' AS state,
       CAST(NULL AS CHAR(64)) AS error_type, CAST(NULL AS BINARY) AS error_response,
       CAST(NULL AS CHAR(16)) AS error_response_encoding, CAST(NULL AS UNSIGNED) AS response_status,
       CAST(NULL AS UNSIGNED) AS duration_ms
FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM job_state_transitions t
                  WHERE t.job_id = j.id
                    AND (t.state = 'awaiting-scheduling' OR t.error_type = 'imported'))
UNION ALL
SELECT t.job_id, t.started_in, t.started_at, NULL, t.attempts, 'executing',
       NULL, NULL, NULL, NULL, NULL
FROM job_state_transitions t WHERE t.started_in IS NOT NULL
UNION ALL
SELECT t.job_id, t.id, t.time, t.retry_at, t.attempts, t.state, t.error_type, t.error_response,
       t.error_response_encoding, t.response_status, t.duration_ms
FROM job_state_transitions t
UNION ALL
SELECT u.job_id, u.started_in, u.started_at, NULL, u.attempts, 'executing',
       NULL, NULL, NULL, NULL, NULL
FROM attempts_under_way u;

-- Each job's latest state: the last step of its history.
CREATE OR REPLACE VIEW job_latest AS
SELECT h.*
FROM job_history h
JOIN (SELECT job_id, MAX(id) AS id FROM job_history GROUP BY job_id) last
  ON last.job_id = h.job_id AND last.id = h.id;
