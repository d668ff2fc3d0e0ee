-- spindle JobDB on SQLite, schema version 3: operator commands (see migrations/0003).
-- Times are UTC in sqlx's text format; strftime gives the same shape for the default.

CREATE TABLE operator_commands (
  id              INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
  issued_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
  issued_by       TEXT    NOT NULL,
  action          TEXT    NOT NULL CHECK (action IN ('expedite', 'postpone', 'flush', 'discard')),
  bucket          TEXT    NULL,
  endpoint_prefix TEXT    NULL,
  job_id          BLOB    NULL,
  created_before  TEXT    NULL,
  postpone_until  TEXT    NULL,
  reason          TEXT    NULL,
  CONSTRAINT command_names_its_jobs CHECK (bucket IS NOT NULL OR endpoint_prefix IS NOT NULL
                                          OR job_id IS NOT NULL OR created_before IS NOT NULL),
  CONSTRAINT postpone_names_a_time CHECK (action <> 'postpone' OR postpone_until IS NOT NULL)
);

CREATE TABLE operator_command_results (
  command_id INTEGER NOT NULL PRIMARY KEY,
  applied_at TEXT    NOT NULL,
  applied_by TEXT    NOT NULL,
  jobs       INTEGER NOT NULL
);
