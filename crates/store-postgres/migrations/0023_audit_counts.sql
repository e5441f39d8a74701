-- The audit rows by action, kept beside the log in the same transaction as each change to
-- it, whoever makes it (this build, an older node still running, a hand edit). A metrics
-- scrape reads these few rows; counting the log itself read every row, which a log of a
-- few hundred million rows makes longer than the statement timeout.
-- Released migrations are never edited: a change is a new numbered file.

-- No row is appended (on any node) from here until this migration commits, so the count
-- below and the triggers agree.
LOCK TABLE audit_log IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE audit_counts (
    action TEXT   PRIMARY KEY,
    n      BIGINT NOT NULL
);

INSERT INTO audit_counts (action, n) SELECT action, COUNT(*) FROM audit_log GROUP BY action;

-- One row per append (an audit batch inserts one row per statement), under the chain's
-- lock, so the counts' row locks add no wait of their own.
CREATE FUNCTION runwarden_audit_row_appended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_counts (action, n) VALUES (NEW.action, 1)
    ON CONFLICT (action) DO UPDATE SET n = audit_counts.n + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_row_appended AFTER INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION runwarden_audit_row_appended();

-- Removals and edits are rare and can be many rows at once: counted once per statement.
CREATE FUNCTION runwarden_audit_rows_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE audit_counts SET n = audit_counts.n - gone.n
    FROM (SELECT action, COUNT(*) AS n FROM removed_rows GROUP BY action) AS gone
    WHERE audit_counts.action = gone.action;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_rows_removed AFTER DELETE ON audit_log
    REFERENCING OLD TABLE AS removed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_audit_rows_removed();

CREATE FUNCTION runwarden_audit_rows_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE audit_counts SET n = audit_counts.n - gone.n
    FROM (SELECT action, COUNT(*) AS n FROM removed_rows GROUP BY action) AS gone
    WHERE audit_counts.action = gone.action;
    INSERT INTO audit_counts (action, n)
    SELECT action, COUNT(*) FROM added_rows GROUP BY action
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
    DELETE FROM audit_counts;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_log_emptied AFTER TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_audit_log_emptied();
