-- spindle JobDB, schema version 9: a key's order is acceptance order; expiry and flush end a
-- job's turn.
--
-- `ordering_position` (on `jobs`, copied to `open_jobs.position`) is an ordered job's place in
-- its key's order: a ULID minted by the Director that accepted the job, when it accepted it
-- (for a job a router forwarded, when the Director took it, not when the router named it), and
-- kept when a drainer moves the job. A key's jobs go in position order, so two routers whose
-- clocks disagree cannot reorder a producer's sequential submissions. Jobs of schema 8 have
-- none: their id is their position (the order schema 8 used).
--
-- An entry that moves to `archiving` (expired, or flushed by an operator) leaves its sequence
-- (`seq` NULL, not held): its end lets the key's next job go at once, whether or not an
-- archive is configured; the archive copies what ended, it does not decide when. A held job
-- whose expiry passes ends then, not at its turn: `open_jobs_held_expiry` finds it.

ALTER TABLE jobs
  ADD COLUMN ordering_position BINARY(16) NULL
    COMMENT 'place in its key''s order: minted when accepted, kept when moved (NULL: the id)';

ALTER TABLE open_jobs
  ADD COLUMN position BINARY(16) NULL COMMENT 'an ordered job''s jobs.ordering_position',
  DROP KEY open_jobs_seq,
  ADD KEY open_jobs_seq (seq, held, position),
  ADD KEY open_jobs_held_expiry (held, expire_at);

UPDATE open_jobs SET position = job_id WHERE seq IS NOT NULL;

-- A block names its key, so it can follow the key to another JobDB (a drainer carries it) and
-- an operator reads which key is blocked without the job that blocked it (which may have
-- stayed in a retired JobDB).
ALTER TABLE ordering_blocked
  ADD COLUMN bucket VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  ADD COLUMN endpoint VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  ADD COLUMN ordering_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;

UPDATE ordering_blocked b JOIN jobs j ON j.id = b.job_id
SET b.bucket = j.bucket, b.endpoint = j.endpoint, b.ordering_key = j.ordering_key;

-- Jobs that expired waiting for the archive kept their key's turn under schema 8; the ones that
-- asked to block it do so now, as an expiry does from this schema on.
INSERT IGNORE INTO ordering_blocked (seq, job_id, state, blocked_at, bucket, endpoint, ordering_key)
SELECT o.seq, o.job_id, 'archiving', t.time, j.bucket, j.endpoint, j.ordering_key
FROM open_jobs o
JOIN jobs j ON j.id = o.job_id
JOIN job_state_transitions t ON t.job_id = o.job_id AND t.id = o.transition_id
WHERE o.state = 'archiving' AND o.seq IS NOT NULL AND j.ordering_blocks
  AND t.error_type = 'expired';

UPDATE open_jobs SET seq = NULL, held = 0 WHERE state = 'archiving';
