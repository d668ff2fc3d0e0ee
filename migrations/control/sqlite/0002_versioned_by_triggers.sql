-- spindle control database, schema version 2, in SQLite: every change takes a version,
-- whoever makes it (see the MySQL migration). An UPDATE that leaves `version` as it was, or an
-- INSERT with `version` 0, takes the next one; a DELETE is refused (set `removed = 1`).

CREATE TRIGGER subscriptions_update_takes_a_version AFTER UPDATE ON subscriptions
FOR EACH ROW WHEN NEW.version = OLD.version
BEGIN
  UPDATE control_version SET version = version + 1 WHERE id = 1;
  UPDATE subscriptions SET version = (SELECT version FROM control_version WHERE id = 1)
    WHERE id = NEW.id;
END;

CREATE TRIGGER subscriptions_insert_takes_a_version AFTER INSERT ON subscriptions
FOR EACH ROW WHEN NEW.version = 0
BEGIN
  UPDATE control_version SET version = version + 1 WHERE id = 1;
  UPDATE subscriptions SET version = (SELECT version FROM control_version WHERE id = 1)
    WHERE id = NEW.id;
END;

CREATE TRIGGER subscriptions_are_removed_not_deleted BEFORE DELETE ON subscriptions
BEGIN
  SELECT RAISE(ABORT, 'a subscription is removed, not deleted: UPDATE subscriptions SET removed = 1');
END;
