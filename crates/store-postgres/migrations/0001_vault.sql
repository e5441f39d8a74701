-- The vault: envelope-sealed records (V1) and the hash-chained audit log (V7).
-- The same tables and columns as SQLite's 0001_vault, in PostgreSQL types: times are
-- BIGINT milliseconds UTC, bytes are BYTEA. Released migrations are never edited: a
-- change is a new numbered file, with the same number and name in every backend.

CREATE TABLE sealed (
    kind          TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    algorithm     TEXT    NOT NULL,
    version       BIGINT  NOT NULL,
    master_key_id TEXT    NOT NULL,
    key_nonce     BYTEA   NOT NULL,
    wrapped_key   BYTEA   NOT NULL,
    value_nonce   BYTEA   NOT NULL,
    ciphertext    BYTEA   NOT NULL,
    created_ms    BIGINT  NOT NULL,
    updated_ms    BIGINT  NOT NULL,
    PRIMARY KEY (kind, name)
);

-- The id is assigned by the writer as the tip's id plus one (under the audit lock), never
-- by a sequence, so a deleted row shows as a gap and a deleted tail as a mismatch with
-- audit_tip.
CREATE TABLE audit_log (
    id          BIGINT  PRIMARY KEY,
    time_ms     BIGINT  NOT NULL,
    action      TEXT    NOT NULL,
    success     BOOLEAN NOT NULL,
    secret      TEXT,
    method      TEXT    NOT NULL,
    host        TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    status      BIGINT  NOT NULL,
    duration_ms BIGINT  NOT NULL,
    error       TEXT,
    reason      TEXT,
    actor       TEXT    NOT NULL,
    correlation TEXT,
    prev_hash   BYTEA   NOT NULL,
    hash        BYTEA   NOT NULL
);

CREATE INDEX audit_log_action ON audit_log (action);
CREATE INDEX audit_log_correlation ON audit_log (correlation);

-- One row: the newest id, its hash, and the separately keyed anchor over both.
CREATE TABLE audit_tip (
    id        BIGINT PRIMARY KEY CHECK (id = 1),
    last_id   BIGINT NOT NULL,
    last_hash BYTEA  NOT NULL,
    anchor    BYTEA  NOT NULL
);
