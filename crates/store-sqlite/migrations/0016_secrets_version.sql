-- The secrets' version: one number that every change to an operator's secret raises in
-- the same transaction as the change, whoever makes it (this build, an older one, a hand
-- edit). A process learns that the secrets changed, here or in another process, by
-- reading this one row from a read-only connection, which never waits for a writer,
-- instead of reading the list of secrets on every guarded call.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE secrets_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);

INSERT INTO secrets_version (id, version) VALUES (1, 0);

CREATE TRIGGER sealed_secret_inserted AFTER INSERT ON sealed
    WHEN NEW.kind = 'secret'
BEGIN
    UPDATE secrets_version SET version = version + 1 WHERE id = 1;
END;

CREATE TRIGGER sealed_secret_updated AFTER UPDATE ON sealed
    WHEN OLD.kind = 'secret' OR NEW.kind = 'secret'
BEGIN
    UPDATE secrets_version SET version = version + 1 WHERE id = 1;
END;

CREATE TRIGGER sealed_secret_deleted AFTER DELETE ON sealed
    WHEN OLD.kind = 'secret'
BEGIN
    UPDATE secrets_version SET version = version + 1 WHERE id = 1;
END;
