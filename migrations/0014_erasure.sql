-- spindle JobDB, schema version 14: erasure.
--
-- `spindle erase` removes the payloads, headers and answer bodies of a bucket's jobs (and the
-- envelopes of its events) while keeping that each job existed and how it ended: ids, times,
-- states and error types stay, `erased_at` says when the rest went. It is the second
-- sanctioned UPDATE of a JobDB (after `jobs.expire_at`), done only to ended jobs.
--
-- An operator command may name jobs by the start of their idempotency key (with a bucket:
-- keys are a bucket's own); `spindle erase --idempotency-key-prefix` uses it to end a
-- customer's jobs still in flight before erasing them.

ALTER TABLE operator_commands
  ADD COLUMN idempotency_key_prefix VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    COMMENT 'jobs whose idempotency key starts with this';

ALTER TABLE jobs
  ADD COLUMN erased_at DATETIME(6) NULL COMMENT 'UTC; payload, headers and answers erased then';

ALTER TABLE events
  ADD COLUMN erased_at DATETIME(6) NULL COMMENT 'UTC; the envelope erased then';
