-- The vault: envelope-sealed records (V1) and the hash-chained audit log (V7).
-- Released migrations are never edited: a change is a new numbered file.

CREATE TABLE sealed (
    kind          TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    algorithm     TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    master_key_id TEXT    NOT NULL,
    key_nonce     BLOB    NOT NULL,
    wrapped_key   BLOB    NOT NULL,
    value_nonce   BLOB    NOT NULL,
    ciphertext    BLOB    NOT NULL,
    created_ms    INTEGER NOT NULL,
    updated_ms    INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
);

-- The id is assigned by the writer as the tip's id plus one, never by SQLite, so a
-- deleted row shows as a gap and a deleted tail as a mismatch with audit_tip.
CREATE TABLE audit_log (
    id          INTEGER PRIMARY KEY,
    time_ms     INTEGER NOT NULL,
    action      TEXT    NOT NULL,
    success     INTEGER NOT NULL,
    secret      TEXT,
    method      TEXT    NOT NULL,
    host        TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    status      INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    error       TEXT,
    reason      TEXT,
    actor       TEXT    NOT NULL,
    correlation TEXT,
    prev_hash   BLOB    NOT NULL,
    hash        BLOB    NOT NULL
);

CREATE INDEX audit_log_action ON audit_log (action);
CREATE INDEX audit_log_correlation ON audit_log (correlation);

-- One row: the newest id, its hash, and the separately keyed anchor over both.
CREATE TABLE audit_tip (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    last_id   INTEGER NOT NULL,
    last_hash BLOB    NOT NULL,
    anchor    BLOB    NOT NULL
);
