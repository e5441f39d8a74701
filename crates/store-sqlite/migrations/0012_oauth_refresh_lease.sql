-- M18: one refresh of an OAuth token at a time across processes. A row is the lease of
-- one token record (`oauth.<hash>`): who holds it and until when. An expired lease is
-- taken over; a holder gives it back after saving the refreshed token.
-- Released migrations are never edited: a change is a new numbered file.

CREATE TABLE oauth_refresh_lease (
    key         TEXT   NOT NULL PRIMARY KEY,
    holder      TEXT   NOT NULL,
    expires_ms  INTEGER NOT NULL
);
