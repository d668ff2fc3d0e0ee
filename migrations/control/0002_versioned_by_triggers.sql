-- spindle control database, schema version 2: every change takes a version, whoever makes it.
--
-- Caches read only the rows past the version they hold. spindle's own statements take the
-- next `control_version.version` and write it; these triggers do the same for an operator's
-- SQL, so no cache has to read the whole table again to find an edit made by hand:
-- an UPDATE that leaves `version` as it was takes the next one; an INSERT with `version` 0
-- (the column's default now) takes the next one; a DELETE is refused, since no cache could
-- learn of it (set `removed = 1` instead).

ALTER TABLE subscriptions ALTER COLUMN version SET DEFAULT 0;

CREATE TRIGGER subscriptions_update_takes_a_version BEFORE UPDATE ON subscriptions
FOR EACH ROW
BEGIN
  IF NEW.version = OLD.version THEN
    UPDATE control_version SET version = version + 1 WHERE id = 1;
    SET NEW.version = (SELECT version FROM control_version WHERE id = 1);
  END IF;
END;

CREATE TRIGGER subscriptions_insert_takes_a_version BEFORE INSERT ON subscriptions
FOR EACH ROW
BEGIN
  IF NEW.version = 0 THEN
    UPDATE control_version SET version = version + 1 WHERE id = 1;
    SET NEW.version = (SELECT version FROM control_version WHERE id = 1);
  END IF;
END;

CREATE TRIGGER subscriptions_are_removed_not_deleted BEFORE DELETE ON subscriptions
FOR EACH ROW
  SIGNAL SQLSTATE '45000'
    SET MESSAGE_TEXT = 'a subscription is removed, not deleted: UPDATE subscriptions SET removed = 1';
