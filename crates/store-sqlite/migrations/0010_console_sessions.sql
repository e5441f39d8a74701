-- Console sessions (O4): only the SHA-256 of a session id is stored, bound to the API
-- token it was opened with; a revoked token ends its sessions (lookups join the token).
-- Released migrations are never edited: a change is a new numbered file.

CREATE TABLE console_sessions (
    hash        BLOB    NOT NULL PRIMARY KEY,
    token_id    TEXT    NOT NULL REFERENCES api_tokens (id),
    created_ms  INTEGER NOT NULL,
    expires_ms  INTEGER NOT NULL
);

CREATE INDEX console_sessions_by_expiry ON console_sessions (expires_ms);
