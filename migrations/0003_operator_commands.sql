-- spindle JobDB, schema version 3: operator commands.
--
-- Operators change the work of a running Director by appending a command here with plain SQL
-- (docs/operations.md has the statements); nothing else is updated. The owning Director reads
-- new commands within a second, applies each to the matching jobs that wait for an attempt
-- (cached or not), appends one transition per affected job whose error_type names the action
-- and whose error_response names the command, then records the command's result.

CREATE TABLE operator_commands (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  issued_at       DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
                                  COMMENT 'server time zone; use UTC_TIMESTAMP(6) to be explicit',
  issued_by       VARCHAR(255)    CHARACTER SET utf8mb4 NOT NULL COMMENT 'who: CURRENT_USER() or a name',
  action          ENUM('expedite', 'postpone', 'flush', 'discard') NOT NULL,
  -- Which jobs: every condition given must hold; at least one must be given.
  bucket          VARCHAR(128)    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  endpoint_prefix VARCHAR(2048)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
                                  COMMENT 'jobs whose endpoint starts with this',
  job_id          BINARY(16)      NULL,
  created_before  DATETIME(6)     NULL COMMENT 'UTC',
  postpone_until  DATETIME(6)     NULL COMMENT 'UTC; postpone only',
  reason          VARCHAR(255)    CHARACTER SET utf8mb4 NULL,
  PRIMARY KEY (id),
  CONSTRAINT command_names_its_jobs CHECK (bucket IS NOT NULL OR endpoint_prefix IS NOT NULL
                                          OR job_id IS NOT NULL OR created_before IS NOT NULL),
  CONSTRAINT postpone_names_a_time CHECK (action <> 'postpone' OR postpone_until IS NOT NULL)
) ENGINE = InnoDB;

-- One row per applied command, written by the Director that applied it.
CREATE TABLE operator_command_results (
  command_id BIGINT UNSIGNED NOT NULL,
  applied_at DATETIME(6)     NOT NULL COMMENT 'UTC',
  applied_by VARCHAR(255)    CHARACTER SET utf8mb4 NOT NULL COMMENT 'the Director (its holder name)',
  jobs       INT UNSIGNED    NOT NULL COMMENT 'jobs the command changed',
  PRIMARY KEY (command_id)
) ENGINE = InnoDB;
