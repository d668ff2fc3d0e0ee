-- spindle JobDB, schema version 8: ordered delivery per key.
--
-- A job may carry an `ordering_key`: the jobs of one (bucket, endpoint, ordering_key), a
-- *sequence*, are delivered one at a time in id order (the order they were accepted), each
-- after the previous ended. The order lives here, not in a Director's memory, so it survives
-- crashes, takeovers and moves between JobDBs.
--
-- `open_jobs.seq` names an ordered job's sequence (16 bytes of a hash of the three; NULL for an
-- unordered job) and `held` says it waits for its turn: every ordered job enters `open_jobs`
-- held. Backlog pages, `next_due_after` and operator commands that make jobs due leave held
-- entries alone. A Director's *sequencer* releases (`held = 0`) the oldest entry of a sequence
-- that has no released one, in a commit of its writer, and hands it to the scheduler; when the
-- released job ends its entry goes, and the sequencer releases the next.
--
-- `ordering_blocked` holds the sequences stopped by a job that ended without success
-- (discarded, or archived on expiry) and asked to block (`jobs.ordering_blocks`): nothing of a
-- blocked sequence is released until an operator deletes its row.

ALTER TABLE jobs
  ADD COLUMN ordering_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    COMMENT 'jobs of one bucket, endpoint and ordering key are delivered one at a time, in id order',
  ADD COLUMN ordering_blocks BOOLEAN NOT NULL DEFAULT FALSE
    COMMENT 'an unsuccessful end blocks the key''s later jobs (ordering_blocked)';

ALTER TABLE open_jobs
  ADD COLUMN seq BINARY(16) NULL COMMENT 'the ordered sequence: hash of bucket, endpoint, ordering key',
  ADD COLUMN held BOOLEAN NOT NULL DEFAULT FALSE COMMENT 'an ordered job waiting for its turn',
  ADD KEY open_jobs_seq (seq, held, job_id);

CREATE TABLE ordering_blocked (
  seq        BINARY(16)  NOT NULL,
  job_id     BINARY(16)  NOT NULL COMMENT 'the job whose end blocked the sequence',
  state      VARCHAR(32) NOT NULL COMMENT 'how it ended: discarded or archived',
  blocked_at DATETIME(6) NOT NULL,
  PRIMARY KEY (seq)
) ENGINE = InnoDB;
