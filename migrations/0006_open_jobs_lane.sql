-- spindle JobDB, schema version 6: each `open_jobs` entry names its job's lane, indexed, so a
-- read of "every lane but one" does not walk that lane's entries.
--
-- When one endpoint's jobs hold most of a Director's cache (a *hog*), backlog pages leave that
-- lane out. Without a lane here such a page walked `open_jobs` in job order, joining `jobs` for
-- each entry's endpoint: behind a 500,000-job backlog of one endpoint a page examined up to
-- 850,000 rows and took 2.2 s of MariaDB. With `(lane, job_id)` indexed the page reads the
-- other lanes' entries only.
--
-- `lane` is the endpoint cut at its first `?` or `#` (as the dashboard spells it), as bytes and
-- at most 2,048 of them (an endpoint's limit), so the index key stays within InnoDB's 3,072.
-- The writer fills it when it inserts an entry, from the job's row; NULL (an entry written by
-- hand, or by a release before this one) means "unknown", and such entries are read by every
-- page.

ALTER TABLE open_jobs
  ADD COLUMN lane VARBINARY(2048) NULL COMMENT 'the job''s lane: endpoint cut at ? or #',
  ADD KEY open_jobs_lane (lane, job_id);

UPDATE open_jobs o JOIN jobs j ON j.id = o.job_id
SET o.lane = LEFT(CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(j.endpoint, '?', 1), '#', 1) AS BINARY), 2048);
