-- spindle JobDB on SQLite, schema version 4: `open_jobs`, each unfinished job's latest resting
-- state (read the MySQL migration's comments), and an index for MAX(id).

CREATE INDEX job_state_transitions_id ON job_state_transitions (id);

CREATE TABLE open_jobs (
  job_id        BLOB    NOT NULL PRIMARY KEY,
  transition_id INTEGER NOT NULL,
  state         TEXT    NOT NULL CHECK (state IN ('awaiting-scheduling', 'executing',
                  'succeeded', 'discarded', 'awaiting-retry', 'archiving', 'archived', 'moved')),
  attempts      INTEGER NOT NULL,
  retry_at      TEXT    NULL,
  expire_at     TEXT    NULL
) WITHOUT ROWID;

CREATE INDEX open_jobs_state_retry ON open_jobs (state, retry_at);
CREATE INDEX open_jobs_expiry ON open_jobs (expire_at);

INSERT INTO open_jobs (job_id, transition_id, state, attempts, retry_at, expire_at)
SELECT t.job_id, t.id, t.state, t.attempts, t.retry_at, j.expire_at
FROM job_state_transitions t
JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last
  ON last.job_id = t.job_id AND last.id = t.id
JOIN jobs j ON j.id = t.job_id
WHERE t.state NOT IN ('succeeded', 'discarded', 'archived', 'moved');
