-- A claim's fencing token: every claim of a run raises claim_epoch by one, and every
-- guarded write of a segment (heartbeat, fence mark, event append, settle, decision ask,
-- requeue) checks it beside the owner, so a segment of an older claim of the same run can
-- never write, even in the same process under the same owner name.
-- Released migrations are never edited: a change is a new numbered file.
ALTER TABLE runs ADD COLUMN claim_epoch BIGINT NOT NULL DEFAULT 0;
