-- spindle JobDB (SQLite), schema version 9: a key's order is acceptance order; expiry and flush
-- end a job's turn. See migrations/0009_ordering_positions.sql for the meaning.

ALTER TABLE jobs ADD COLUMN ordering_position BLOB NULL;

ALTER TABLE open_jobs ADD COLUMN position BLOB NULL;

DROP INDEX open_jobs_seq;
CREATE INDEX open_jobs_seq ON open_jobs (seq, held, position);
CREATE INDEX open_jobs_held_expiry ON open_jobs (held, expire_at);

UPDATE open_jobs SET position = job_id WHERE seq IS NOT NULL;

ALTER TABLE ordering_blocked ADD COLUMN bucket TEXT NULL;
ALTER TABLE ordering_blocked ADD COLUMN endpoint TEXT NULL;
ALTER TABLE ordering_blocked ADD COLUMN ordering_key TEXT NULL;

UPDATE ordering_blocked SET
  bucket = (SELECT j.bucket FROM jobs j WHERE j.id = ordering_blocked.job_id),
  endpoint = (SELECT j.endpoint FROM jobs j WHERE j.id = ordering_blocked.job_id),
  ordering_key = (SELECT j.ordering_key FROM jobs j WHERE j.id = ordering_blocked.job_id);

INSERT OR IGNORE INTO ordering_blocked (seq, job_id, state, blocked_at, bucket, endpoint, ordering_key)
SELECT o.seq, o.job_id, 'archiving', t.time, j.bucket, j.endpoint, j.ordering_key
FROM open_jobs o
JOIN jobs j ON j.id = o.job_id
JOIN job_state_transitions t ON t.job_id = o.job_id AND t.id = o.transition_id
WHERE o.state = 'archiving' AND o.seq IS NOT NULL AND j.ordering_blocks
  AND t.error_type = 'expired';

UPDATE open_jobs SET seq = NULL, held = 0 WHERE state = 'archiving';
