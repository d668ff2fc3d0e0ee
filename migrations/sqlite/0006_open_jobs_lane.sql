-- spindle JobDB on SQLite, schema version 6: each `open_jobs` entry names its job's lane,
-- indexed (read the MySQL migration's comments).

ALTER TABLE open_jobs ADD COLUMN lane TEXT NULL;

CREATE INDEX open_jobs_lane ON open_jobs (lane, job_id);

UPDATE open_jobs SET lane = (
  SELECT substr(j.endpoint, 1, min(
           CASE WHEN instr(j.endpoint, '?') > 0 THEN instr(j.endpoint, '?') - 1
                ELSE length(j.endpoint) END,
           CASE WHEN instr(j.endpoint, '#') > 0 THEN instr(j.endpoint, '#') - 1
                ELSE length(j.endpoint) END))
  FROM jobs j WHERE j.id = open_jobs.job_id);
