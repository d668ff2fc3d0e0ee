-- spindle control database (SQLite), schema version 1: subscriptions. See
-- migrations/control/0001_subscriptions.sql for the meaning.

CREATE TABLE subscriptions (
  id         BLOB    NOT NULL PRIMARY KEY,
  bucket     TEXT    NOT NULL,
  enabled    BOOLEAN NOT NULL,
  removed    BOOLEAN NOT NULL DEFAULT FALSE,
  spec       TEXT    NOT NULL,
  version    INTEGER NOT NULL,
  created_at TEXT    NOT NULL,
  updated_at TEXT    NOT NULL
);
CREATE INDEX subscriptions_version ON subscriptions (version);
CREATE INDEX subscriptions_bucket ON subscriptions (bucket, id);

CREATE TABLE control_version (
  id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  version INTEGER NOT NULL
);

INSERT INTO control_version (id, version) VALUES (1, 0);
