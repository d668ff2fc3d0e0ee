-- spindle control database, schema version 1: subscriptions.
--
-- The control database keeps what must outlive JobDB cycling: subscriptions (who gets which
-- events of a bucket). One per site, on the MySQL servers (`--control-db`); `spindle dev`
-- keeps it in a SQLite file. Every router and Director caches it and applies a change within
-- a second or two.
--
-- `spec` is the subscription as given (JSON: `{"given": {...}, "created_at", "updated_at"}`,
-- its signing secret included, so this database is as secret as the token file). `enabled`
-- and `removed` are columns so operators can read and set them in SQL. Every change takes the
-- next `control_version.version` in its transaction and writes it in the row's `version`:
-- caches read the rows past the version they hold. An operator's `UPDATE` must do the same
-- (docs/operations.md); caches also reread everything every 30 s.

CREATE TABLE subscriptions (
  id         BINARY(16)      NOT NULL COMMENT 'ULID (HEX(id) in SQL)',
  bucket     VARCHAR(128)    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  enabled    BOOLEAN         NOT NULL COMMENT 'disabled: its jobs wait (until enabled, or expiry)',
  removed    BOOLEAN         NOT NULL DEFAULT FALSE COMMENT 'no new event reaches it',
  spec       MEDIUMTEXT      CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  version    BIGINT          NOT NULL COMMENT 'control_version of its last change',
  created_at DATETIME(6)     NOT NULL,
  updated_at DATETIME(6)     NOT NULL,
  PRIMARY KEY (id),
  KEY subscriptions_version (version),
  KEY subscriptions_bucket (bucket, id)
) ENGINE = InnoDB;

CREATE TABLE control_version (
  id      TINYINT UNSIGNED NOT NULL,
  version BIGINT           NOT NULL,
  PRIMARY KEY (id),
  CONSTRAINT control_version_single_row CHECK (id = 1)
) ENGINE = InnoDB;

INSERT INTO control_version (id, version) VALUES (1, 0);
