-- spindle JobDB, schema version 11: every published event is kept.
--
-- An event that matches no subscription when it is published still gets its `events` row,
-- so it has an id and a subscription added later can be back-filled with it. Its envelope
-- (`{"type", "timestamp", "data"}`, what a job of it would carry) is kept in `payload`. An
-- event with jobs here leaves `payload` NULL: each of its jobs carries the envelope already,
-- and back-fill reads it from the first of them.

ALTER TABLE events
  ADD COLUMN payload MEDIUMBLOB NULL COMMENT 'the envelope, when no job here carries it';
