-- The queued runs in the order a claim takes them (oldest first): a claim walks this
-- index and stops at the first due run, instead of sorting every queued run.
-- Released migrations are never edited: a change is a new numbered file.
CREATE INDEX runs_queued_order ON runs (created_ms, id) WHERE status = 'queued';
