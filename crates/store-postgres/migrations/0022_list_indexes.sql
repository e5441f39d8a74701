-- The lists of runs (the API, the console, `runs list`) filter by state or agent, and the
-- lists of decisions by state, newest first. Without an index that leads with the filter
-- and ends with the id, a rare state (`failed` among a million completed runs, `pending`
-- among every decision ever answered) was found by reading every row.
-- `runs_agent_id` serves every lookup `runs_agent` did.
-- Released migrations are never edited: a change is a new numbered file.
CREATE INDEX runs_status_id ON runs (status, id);
CREATE INDEX runs_agent_id ON runs (agent, id);
DROP INDEX runs_agent;
CREATE INDEX decisions_status_id ON decisions (status, id);
-- A claim walks `runs_queued_order` since migration 0020; nothing reads this one, and every
-- change of a run's state wrote it.
DROP INDEX runs_status_retry;
