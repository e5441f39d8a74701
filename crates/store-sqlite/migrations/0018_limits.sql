-- Limits on outbound calls, shared by every process on this file: one row per call that
-- holds a concurrency slot (renewed while it runs; a row whose lease ran out no longer
-- counts, so a crashed holder's slot comes back), and one token bucket per rate limit.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE limit_holds (
    limit_key  TEXT    NOT NULL,
    holder     TEXT    NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (limit_key, holder)
);

CREATE INDEX limit_holds_holder ON limit_holds (holder);

CREATE TABLE limit_buckets (
    limit_key   TEXT    PRIMARY KEY,
    tokens      REAL    NOT NULL,
    refilled_ms INTEGER NOT NULL
);
