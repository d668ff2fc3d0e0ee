-- spindle JobDB, schema version 10: events and subscriptions.
--
-- An event is published once (`POST /v1/events`) and becomes one job per matching
-- subscription, all written in one transaction. `events` has one row per event that made at
-- least one job here (a drainer's move writes it again in the JobDB the job moves to; a
-- repeat is ignored); each such job names its event, the event's type and the subscription it
-- is for. Subscriptions themselves live in the control database, not here: they outlive JobDB
-- cycling.
--
-- Recipes (docs/operations.md): who got event X is `jobs WHERE event_id = X` joined to
-- `job_latest`; which events subscription Y missed is `events` of its types with no job of Y.

ALTER TABLE jobs
  ADD COLUMN event_id BINARY(16) NULL COMMENT 'the event it delivers (ULID; HEX(event_id) in SQL)',
  ADD COLUMN event_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    COMMENT 'the event''s type',
  ADD COLUMN subscription_id BINARY(16) NULL COMMENT 'the subscription it delivers to (ULID)',
  ADD KEY jobs_event (event_id, subscription_id);

CREATE TABLE events (
  id         BINARY(16)   NOT NULL COMMENT 'ULID (HEX(id) in SQL)',
  bucket     VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  event_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  created_at DATETIME(6)  NOT NULL COMMENT 'when it was published',
  PRIMARY KEY (id),
  KEY events_type (bucket, event_type, id)
) ENGINE = InnoDB;
