-- Idempotency-Key on POST /v1/runs: one row per (scope, key), naming the run the key made
-- and the SHA-256 of the request's canonical body. The primary key makes two racing
-- requests with one key create one run. The key is written before its run in the same
-- transaction, so the reference is checked at commit. Released migrations are never edited.
CREATE TABLE run_idempotency_keys (
    scope      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    body_hash  TEXT    NOT NULL,
    run_id     TEXT    NOT NULL REFERENCES runs (id) DEFERRABLE INITIALLY DEFERRED,
    created_ms BIGINT  NOT NULL,
    PRIMARY KEY (scope, key)
);

-- Worker presence: each worker process (`runwarden worker`, `serve` with workers) writes
-- its row every few seconds, so `enqueue` and `events --follow` can say when no worker
-- has been seen lately. Rows of processes gone for a day are pruned by the next beat.
CREATE TABLE workers (
    id      TEXT    PRIMARY KEY,
    seen_ms BIGINT NOT NULL
);
