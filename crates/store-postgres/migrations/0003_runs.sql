-- Runs and their events (R1), the lease (R3), the cancel (R4) and the write fence
-- (R7). Released migrations are never edited: a change is a new numbered file.

-- One row per run. status is the only source of truth for "is this run cancelled?"
-- (R5, R6). request is JSON text and is dropped by a cancel (R4). claimed_by and
-- lease_expires_ms name the segment holding (or last holding) the lease (R3);
-- pending_effect is the mark of a write that started and was not recorded (R7).
CREATE TABLE runs (
    id                 TEXT   PRIMARY KEY,
    agent              TEXT   NOT NULL,
    status             TEXT   NOT NULL,
    termination_reason TEXT,
    request            TEXT,
    claimed_by         TEXT,
    lease_expires_ms   BIGINT,
    pending_effect     TEXT,
    requeue_count      BIGINT NOT NULL DEFAULT 0,
    rounds             BIGINT NOT NULL DEFAULT 0,
    correlation        TEXT   NOT NULL,
    created_ms         BIGINT NOT NULL,
    updated_ms         BIGINT NOT NULL
);

-- The reaper looks for running rows whose lease expired (R9); workers look for queued rows.
CREATE INDEX runs_status_lease ON runs (status, lease_expires_ms);
CREATE INDEX runs_agent ON runs (agent);

-- seq is assigned by the writer as MAX(seq) + 1 inside a transaction that first locks the
-- run's row with its guarded UPDATE, so concurrent appenders on any node take turns and a
-- sequence is strictly increasing per run and never duplicated (R1).
CREATE TABLE run_events (
    run_id  TEXT   NOT NULL REFERENCES runs (id),
    seq     BIGINT NOT NULL,
    kind    TEXT   NOT NULL,
    payload TEXT   NOT NULL,
    time_ms BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
