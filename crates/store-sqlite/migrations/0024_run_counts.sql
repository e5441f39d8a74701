-- The ended runs by state (completed, failed, cancelled), kept beside the runs, so a
-- metrics scrape reads three rows and the runs still under way. Counting the runs read
-- every row, about 50 ms per million runs at every scrape, and a deployment ends millions
-- a week.
-- Triggers keep the counts in the transaction that changes a run's state, whoever writes
-- it (an older build, a hand edit), so they are never ahead of or behind the rows. Their
-- check runs at each change of a run's state and their write once per run that ends:
-- about 11 us of the one writer's time per run, about 5 % of runs/s at the limit.
-- The states of runs under way are not kept: they are few, and read from `runs_status_id`.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE run_counts (
    status TEXT    PRIMARY KEY,
    n      INTEGER NOT NULL
) WITHOUT ROWID;

-- The migration holds the write lock, so no run changes while they are counted.
INSERT INTO run_counts (status, n)
SELECT status, COUNT(*) FROM runs
WHERE status IN ('completed', 'failed', 'cancelled')
GROUP BY status;

-- One trigger for both ends of a change, so a change of a run under way pays for one
-- check. runwarden never reopens, removes or inserts an ended run; a hand edit or another
-- tool may, and the counts follow it.
CREATE TRIGGER run_state_changed AFTER UPDATE OF status ON runs
    WHEN OLD.status IS NOT NEW.status
        AND (NEW.status IN ('completed', 'failed', 'cancelled')
            OR OLD.status IN ('completed', 'failed', 'cancelled'))
BEGIN
    UPDATE run_counts SET n = n - 1 WHERE status = OLD.status;
    INSERT INTO run_counts (status, n)
    SELECT NEW.status, 1 WHERE NEW.status IN ('completed', 'failed', 'cancelled')
    ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER run_removed AFTER DELETE ON runs
    WHEN OLD.status IN ('completed', 'failed', 'cancelled')
BEGIN
    UPDATE run_counts SET n = n - 1 WHERE status = OLD.status;
END;

CREATE TRIGGER run_inserted_ended AFTER INSERT ON runs
    WHEN NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    INSERT INTO run_counts (status, n) VALUES (NEW.status, 1)
    ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
