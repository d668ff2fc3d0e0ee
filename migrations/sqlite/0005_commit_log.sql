-- spindle JobDB on SQLite, schema version 5: a delivered job costs its `jobs` row and the row
-- of its outcome, and `open_jobs` holds only jobs that rest (read the MySQL migration's
-- comments). The views decode the hex ids of `commit_log` with `unhex`, SQLite 3.41 or later
-- (spindle's own engine is newer; so must be a `sqlite3` shell that reads them).

ALTER TABLE job_state_transitions ADD COLUMN started_in INTEGER NULL;
ALTER TABLE job_state_transitions ADD COLUMN started_at TEXT NULL;

CREATE TABLE commit_log (
  id       INTEGER NOT NULL PRIMARY KEY,
  time     TEXT    NOT NULL,
  accepted TEXT    NULL,
  started  TEXT    NULL
);

CREATE TABLE jobdb_checkpoint (
  id        INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  open_from INTEGER NOT NULL
);

INSERT INTO jobdb_checkpoint (id, open_from) VALUES (1, 0);

CREATE VIEW attempts_under_way AS
SELECT unhex(json_extract(s.value, '$[0]')) AS job_id, c.id AS started_in, c.time AS started_at,
       json_extract(s.value, '$[1]') AS attempts
FROM jobdb_checkpoint k
JOIN commit_log c ON c.id >= k.open_from
JOIN json_each(c.started) s
WHERE NOT EXISTS (SELECT 1 FROM job_state_transitions t
                  WHERE t.job_id = unhex(json_extract(s.value, '$[0]')) AND t.id > c.id);

CREATE VIEW jobs_fresh AS
SELECT unhex(a.value) AS job_id, c.id AS accepted_in
FROM jobdb_checkpoint k
JOIN commit_log c ON c.id >= k.open_from
JOIN json_each(c.accepted) a
WHERE NOT EXISTS (SELECT 1 FROM job_state_transitions t WHERE t.job_id = unhex(a.value))
  AND NOT EXISTS (SELECT 1 FROM open_jobs o WHERE o.job_id = unhex(a.value));

CREATE VIEW open_work AS
SELECT b.job_id,
       CASE WHEN u.job_id IS NULL THEN b.state ELSE 'executing' END AS state,
       CASE WHEN u.job_id IS NULL THEN b.attempts ELSE u.attempts END AS attempts,
       CASE WHEN u.job_id IS NULL THEN b.retry_at END AS retry_at,
       u.started_in, u.started_at, b.listed
FROM (SELECT o.job_id, COALESCE(t.state, o.state) AS state,
             COALESCE(t.attempts, o.attempts) AS attempts,
             CASE WHEN t.id IS NULL THEN o.retry_at ELSE t.retry_at END AS retry_at,
             1 AS listed
      FROM open_jobs o
      LEFT JOIN job_state_transitions t ON t.job_id = o.job_id AND t.id > o.transition_id
      UNION ALL
      SELECT f.job_id, 'awaiting-scheduling', 0, NULL, 0 FROM jobs_fresh f) b
LEFT JOIN attempts_under_way u ON u.job_id = b.job_id;

CREATE VIEW job_history AS
SELECT j.id AS job_id, 0 AS id, j.created_at AS time, NULL AS retry_at, 0 AS attempts,
       'awaiting-scheduling' AS state, NULL AS error_type, NULL AS error_response,
       NULL AS error_response_encoding, NULL AS response_status, NULL AS duration_ms
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

DROP VIEW job_latest;
CREATE VIEW job_latest AS
SELECT h.*
FROM job_history h
JOIN (SELECT job_id, MAX(id) AS id FROM job_history GROUP BY job_id) last
  ON last.job_id = h.job_id AND last.id = h.id;
