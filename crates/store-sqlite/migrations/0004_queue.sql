-- The queue (R3, R9): when a queued run's next attempt may start. Released
-- migrations are never edited: a change is a new numbered file.

-- retry_at_ms is the backoff of a requeued run (R9); a worker claims only queued rows whose
-- retry_at_ms is due. 0 means "at once": rows queued before this migration are due.
ALTER TABLE runs ADD COLUMN retry_at_ms INTEGER NOT NULL DEFAULT 0;

-- Workers look for due queued rows; the reaper keeps using runs_status_lease.
CREATE INDEX runs_status_retry ON runs (status, retry_at_ms);
