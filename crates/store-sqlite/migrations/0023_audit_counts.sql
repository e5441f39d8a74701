-- The audit rows by action, kept beside the log in the same transaction as each change to
-- it, whoever makes it (this build, an older one still running, a hand edit). A metrics
-- scrape reads these few rows; counting the log itself read every row, a tenth of a second
-- per million rows, which a log of a few hundred million rows makes longer than a scrape
-- may take.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE audit_counts (
    action TEXT    PRIMARY KEY,
    n      INTEGER NOT NULL
) WITHOUT ROWID;

-- The migration holds the write lock, so no row is appended between this count and the
-- triggers.
INSERT INTO audit_counts (action, n) SELECT action, COUNT(*) FROM audit_log GROUP BY action;

CREATE TRIGGER audit_row_appended AFTER INSERT ON audit_log
BEGIN
    INSERT INTO audit_counts (action, n) VALUES (NEW.action, 1)
    ON CONFLICT (action) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER audit_row_removed AFTER DELETE ON audit_log
BEGIN
    UPDATE audit_counts SET n = n - 1 WHERE action = OLD.action;
END;

CREATE TRIGGER audit_row_action_changed AFTER UPDATE OF action ON audit_log
    WHEN OLD.action IS NOT NEW.action
BEGIN
    UPDATE audit_counts SET n = n - 1 WHERE action = OLD.action;
    INSERT INTO audit_counts (action, n) VALUES (NEW.action, 1)
    ON CONFLICT (action) DO UPDATE SET n = n + 1;
END;
