-- API tokens (O2): only the SHA-256 of a token is stored, never its value.
-- Released migrations are never edited: a change is a new numbered file.

CREATE TABLE api_tokens (
    id          TEXT   NOT NULL PRIMARY KEY,
    name        TEXT   NOT NULL,
    role        TEXT   NOT NULL CHECK (role IN ('operator', 'viewer')),
    hash        BYTEA  NOT NULL UNIQUE,
    created_ms  BIGINT NOT NULL,
    revoked_ms  BIGINT
);
