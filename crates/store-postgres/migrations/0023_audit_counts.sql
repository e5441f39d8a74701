-- The audit rows by action, kept beside the log, so a metrics scrape reads a few rows and
-- the rows appended since the last fold (counting the log itself read every row, which a
-- log of a few hundred million rows makes longer than the statement timeout).
-- `audit_counts` holds the rows with an id up to `through_id`; rows commit in id order
-- (under the chain's lock), and a scrape folds the newer ones in.
-- Nothing is added to an append: the counts cost the write path nothing.
-- Released migrations are never edited: a change is a new numbered file.

-- No row is appended (on any node) from here until this migration commits, so the count
-- below is of the whole log.
LOCK TABLE audit_log IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE audit_counts (
    action TEXT   PRIMARY KEY,
    n      BIGINT NOT NULL
);

-- The last row counted, its id and hash. The chain links every row to the one before it, so
-- while the log holds this row with this hash it holds every row counted before it; a log
-- that no longer does (wiped, restored from another copy) is counted again from its start.
-- No hash: nothing counted yet, every row is newer than `through_id`.
CREATE TABLE audit_counted (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    through_id   BIGINT  NOT NULL,
    through_hash BYTEA
);

INSERT INTO audit_counts (action, n) SELECT action, COUNT(*) FROM audit_log GROUP BY action;
INSERT INTO audit_counted (id, through_id, through_hash)
SELECT 1, COALESCE(MAX(id), -9223372036854775808),
    (SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1)
FROM audit_log;

-- Rows already counted that are removed or given another action (by hand, or by a tool
-- other than runwarden: runwarden never does either) leave the counts with them, once per
-- statement. The fold holds `audit_counted`'s row while it counts; taking it here too
-- means a removal is either counted by the fold or taken off after it, never neither.
CREATE FUNCTION runwarden_audit_rows_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    through BIGINT;
BEGIN
    SELECT through_id INTO through FROM audit_counted WHERE id = 1 FOR SHARE;
    UPDATE audit_counts SET n = audit_counts.n - gone.n
    FROM (SELECT action, COUNT(*) AS n FROM removed_rows WHERE id <= through
          GROUP BY action) AS gone
    WHERE audit_counts.action = gone.action;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_rows_removed AFTER DELETE ON audit_log
    REFERENCING OLD TABLE AS removed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_audit_rows_removed();

CREATE FUNCTION runwarden_audit_rows_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    through BIGINT;
BEGIN
    SELECT through_id INTO through FROM audit_counted WHERE id = 1 FOR SHARE;
    UPDATE audit_counts SET n = audit_counts.n - gone.n
    FROM (SELECT action, COUNT(*) AS n FROM removed_rows WHERE id <= through
          GROUP BY action) AS gone
    WHERE audit_counts.action = gone.action;
    INSERT INTO audit_counts (action, n)
    SELECT action, COUNT(*) FROM added_rows WHERE id <= through GROUP BY action
    ON CONFLICT (action) DO UPDATE SET n = audit_counts.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_rows_changed AFTER UPDATE ON audit_log
    REFERENCING OLD TABLE AS removed_rows NEW TABLE AS added_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_audit_rows_changed();

CREATE FUNCTION runwarden_audit_log_emptied() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE audit_counts SET n = 0;
    UPDATE audit_counted SET through_id = -9223372036854775808, through_hash = NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_log_emptied AFTER TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_audit_log_emptied();
