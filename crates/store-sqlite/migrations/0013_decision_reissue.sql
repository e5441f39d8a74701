-- M19, R12: an `input` decision asked by a 2026-07-28 server's `input_required` result parks
-- the run; what the call's re-issue needs is kept with the decision, so any worker on any
-- node can resume it, however long it waited: input_key is the question's key in
-- `inputRequests`, request_state the server's opaque `requestState` exactly as sent (NULL
-- when it sent none). Both are NULL for every other decision.
-- Released migrations are never edited: a change is a new numbered file.
ALTER TABLE decisions ADD COLUMN input_key TEXT;
ALTER TABLE decisions ADD COLUMN request_state TEXT;
