-- Operator decisions (R12): one pending question about one tool call of one run.
-- Released migrations are never edited: a change is a new numbered file.
--
-- status is pending, answered, expired or dropped (a cancel won). An answer is one guarded
-- UPDATE ... WHERE status = 'pending', so two answers racing leave exactly one. arguments
-- are the call's arguments as the model produced them, arguments_hash their canonical
-- SHA-256 (the decision is bound to them); answer_arguments are an operator's edit.
CREATE TABLE decisions (
    id               TEXT    PRIMARY KEY,
    run_id           TEXT    NOT NULL REFERENCES runs (id),
    kind             TEXT    NOT NULL,
    round            BIGINT  NOT NULL,
    call_id          TEXT    NOT NULL,
    tool             TEXT    NOT NULL,
    arguments        TEXT    NOT NULL,
    arguments_hash   TEXT    NOT NULL,
    message          TEXT,
    requested_schema TEXT,
    asked_ms         BIGINT  NOT NULL,
    expires_ms       BIGINT  NOT NULL,
    status           TEXT    NOT NULL,
    answer           TEXT,
    reason           TEXT,
    answer_arguments TEXT,
    content          TEXT,
    actor            TEXT,
    answered_ms      BIGINT
);

-- No trigger of its own: an answer appends `decision_answered` to the run's log and (for
-- the kinds that park) changes the run's status in the same transaction, and 0007's
-- triggers NOTIFY every node of both at commit.

-- `decisions list --run`, and the cancel that drops a run's pending decisions.
CREATE INDEX decisions_run ON decisions (run_id, status);
-- The expiry sweep looks for pending decisions that are due.
CREATE INDEX decisions_status_expiry ON decisions (status, expires_ms);
