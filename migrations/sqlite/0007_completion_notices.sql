-- spindle JobDB on SQLite, schema version 7: completion notices (read the MySQL migration's
-- comments).

ALTER TABLE jobs ADD COLUMN on_complete TEXT NULL;

CREATE TABLE notices_owed (
  job_id BLOB NOT NULL PRIMARY KEY
) WITHOUT ROWID;
