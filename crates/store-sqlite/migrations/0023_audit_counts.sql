-- The audit rows by action, kept beside the log, so a metrics scrape reads a few rows and
-- the rows appended since the last fold (counting the log itself read every row, a tenth
-- of a second per million rows, which a log of a few hundred million rows makes longer
-- than a scrape may take). `audit_counts` holds the rows with an id up to `through_id`;
-- rows are appended in id order, and a scrape folds the newer ones in.
-- Nothing is added to an append: the counts cost the write path nothing.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE audit_counts (
    action TEXT    PRIMARY KEY,
    n      INTEGER NOT NULL
) WITHOUT ROWID;

-- The last row counted, its id and hash. The chain links every row to the one before it, so
-- while the log holds this row with this hash it holds every row counted before it; a log
-- that no longer does (wiped, restored from another copy) is counted again from its start.
-- No hash: nothing counted yet, every row is newer than `through_id`.
CREATE TABLE audit_counted (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    through_id   INTEGER NOT NULL,
    through_hash BLOB
);

-- The migration holds the write lock, so no row is appended while the log is counted.
INSERT INTO audit_counts (action, n) SELECT action, COUNT(*) FROM audit_log GROUP BY action;
INSERT INTO audit_counted (id, through_id, through_hash)
SELECT 1, COALESCE(MAX(id), -9223372036854775808),
    (SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1)
FROM audit_log;

-- A row already counted that is removed or given another action (by hand, or by a tool
-- other than runwarden: runwarden never does either) leaves the counts with it.
CREATE TRIGGER audit_row_removed AFTER DELETE ON audit_log
    WHEN OLD.id <= (SELECT through_id FROM audit_counted WHERE id = 1)
BEGIN
    UPDATE audit_counts SET n = n - 1 WHERE action = OLD.action;
END;

CREATE TRIGGER audit_row_action_changed AFTER UPDATE OF action ON audit_log
    WHEN OLD.action IS NOT NEW.action
        AND OLD.id <= (SELECT through_id FROM audit_counted WHERE id = 1)
BEGIN
    UPDATE audit_counts SET n = n - 1 WHERE action = OLD.action;
    INSERT INTO audit_counts (action, n) VALUES (NEW.action, 1)
    ON CONFLICT (action) DO UPDATE SET n = n + 1;
END;
