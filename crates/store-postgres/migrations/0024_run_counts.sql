-- The ended runs by state (completed, failed, cancelled), kept beside the runs, so a
-- metrics scrape reads a few rows and the runs still under way (counting the runs read
-- every row, and a deployment ends millions a day).
-- A run that ends writes one row of its own to `run_count_changes`, in the transaction
-- that ends it: no row is shared, so nodes ending runs at once never wait for each other.
-- A scrape moves those rows into `run_counts`. Changes of runs under way write nothing;
-- their states are few, and read from `runs_status_id`. The trigger costs about 40 us of
-- the server's CPU per run that ends (a function call and an insert).
-- Released migrations are never edited: a change is a new numbered file.

-- No run changes (on any node) from here until this migration commits, so the count below
-- is of every run.
LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE run_counts (
    status TEXT   PRIMARY KEY,
    n      BIGINT NOT NULL
);

-- Changes to the counts not moved into them yet: 1 for a run that ended, -1 for an ended
-- run removed or reopened (by hand: runwarden never does either).
CREATE TABLE run_count_changes (
    id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status TEXT   NOT NULL,
    n      BIGINT NOT NULL
);

INSERT INTO run_counts (status, n)
SELECT status, COUNT(*) FROM runs
WHERE status IN ('completed', 'failed', 'cancelled')
GROUP BY status;

CREATE FUNCTION runwarden_run_state_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status IN ('completed', 'failed', 'cancelled') THEN
        INSERT INTO run_count_changes (status, n) VALUES (OLD.status, -1);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status IN ('completed', 'failed', 'cancelled') THEN
        INSERT INTO run_count_changes (status, n) VALUES (NEW.status, 1);
    END IF;
    RETURN NULL;
END
$$;

-- The condition is checked without calling the function, so a change of a run under way
-- costs one comparison.
CREATE TRIGGER run_state_changed AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND (OLD.status IN ('completed', 'failed', 'cancelled')
            OR NEW.status IN ('completed', 'failed', 'cancelled')))
    EXECUTE FUNCTION runwarden_run_state_changed();

CREATE TRIGGER run_inserted_ended AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runwarden_run_state_changed();

-- Removals come in bulk (a prune by hand): one row per state and statement.
CREATE FUNCTION runwarden_runs_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_count_changes (status, n)
    SELECT status, -COUNT(*) FROM removed_runs
    WHERE status IN ('completed', 'failed', 'cancelled')
    GROUP BY status;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_removed AFTER DELETE ON runs
    REFERENCING OLD TABLE AS removed_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_runs_removed();

CREATE FUNCTION runwarden_runs_emptied() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_count_changes;
    UPDATE run_counts SET n = 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_emptied AFTER TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_runs_emptied();
