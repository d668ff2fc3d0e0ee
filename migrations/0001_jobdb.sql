-- spindle JobDB, schema version 1.
--
-- A JobDB is one MySQL database owned by exactly one Director at a time. Rows are appended,
-- never updated: the only sanctioned UPDATE is an operator moving jobs.expire_at to flush work
-- to the archive. Ids are ULIDs stored as BINARY(16); in SQL, HEX(id) prints the 32-digit form
-- that `spindle` and the RPC API also accept. All times are UTC.

-- One row per job: what to send where, and how to retry it. Only the primary key is indexed;
-- ULIDs sort by creation time, so the one index serves lookups and time ranges.
CREATE TABLE jobs (
  id                   BINARY(16)      NOT NULL COMMENT 'ULID (HEX(id) in SQL)',
  bucket               VARCHAR(128)    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
                                       COMMENT 'isolation key: tenant or source-destination pair',
  endpoint             VARCHAR(2048)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  method               VARCHAR(10)     CHARACTER SET ascii NOT NULL,
  headers              MEDIUMTEXT      CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
                                       COMMENT 'JSON object of the request headers sent',
  payload              MEDIUMBLOB      NOT NULL,
  execution_timeout_ms INT UNSIGNED    NOT NULL,
  backoff_min_delay_ms INT UNSIGNED    NOT NULL,
  backoff_coefficient  DOUBLE          NOT NULL,
  created_at           DATETIME(6)     NOT NULL,
  expire_at            DATETIME(6)     NOT NULL COMMENT 'operators may move this to flush to the archive',
  idempotency_key      VARCHAR(255)    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  PRIMARY KEY (id)
) ENGINE = InnoDB;

-- The append-only log of every state a job enters. A job's current state is its row with the
-- highest id. Ids are assigned by the owning Director and increase monotonically per JobDB.
CREATE TABLE job_state_transitions (
  id                      BIGINT UNSIGNED   NOT NULL,
  job_id                  BINARY(16)        NOT NULL,
  time                    DATETIME(6)       NOT NULL,
  retry_at                DATETIME(6)       NULL COMMENT 'next attempt, for awaiting-retry',
  attempts                SMALLINT UNSIGNED NOT NULL COMMENT 'attempts started so far',
  state                   ENUM('awaiting-scheduling', 'executing', 'succeeded', 'discarded',
                               'awaiting-retry', 'archiving', 'archived') NOT NULL,
  error_type              VARCHAR(64)       CHARACTER SET ascii NULL,
  error_response          MEDIUMBLOB        NULL COMMENT 'start of the failed answer, truncated',
  error_response_encoding VARCHAR(16)       CHARACTER SET ascii NULL,
  response_status         SMALLINT UNSIGNED NULL,
  duration_ms             INT UNSIGNED      NULL,
  PRIMARY KEY (job_id, id)
) ENGINE = InnoDB;

-- The fencing token of the current owner. An owner bumps it when it takes the JobDB, and every
-- write transaction reads it under a shared lock first: a stale owner's writes then fail.
CREATE TABLE jobdb_owner (
  id            TINYINT UNSIGNED NOT NULL,
  fencing_token BIGINT UNSIGNED  NOT NULL,
  holder        VARCHAR(255)     CHARACTER SET utf8mb4 NOT NULL,
  acquired_at   DATETIME(6)      NULL,
  PRIMARY KEY (id),
  CONSTRAINT jobdb_owner_single_row CHECK (id = 1)
) ENGINE = InnoDB;

INSERT INTO jobdb_owner (id, fencing_token, holder, acquired_at) VALUES (1, 0, '', NULL);

-- Each job's latest transition: its current state.
CREATE VIEW job_latest AS
SELECT t.*
FROM job_state_transitions t
JOIN (SELECT job_id, MAX(id) AS id FROM job_state_transitions GROUP BY job_id) last
  ON last.job_id = t.job_id AND last.id = t.id;
