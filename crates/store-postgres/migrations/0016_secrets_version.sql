-- The secrets' version: one number that every change to an operator's secret raises in
-- the same transaction as the change, whoever makes it (this build, an older one, a hand
-- edit). A node learns that the secrets changed, on this node or another, by reading this
-- one row (a plain read never waits for a writer's lock) instead of reading the list of
-- secrets on every guarded call.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE secrets_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT  NOT NULL
);

INSERT INTO secrets_version (id, version) VALUES (1, 0);

CREATE FUNCTION runwarden_secrets_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE secrets_version SET version = version + 1 WHERE id = 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER sealed_secret_inserted AFTER INSERT ON sealed
    FOR EACH ROW WHEN (NEW.kind = 'secret')
    EXECUTE FUNCTION runwarden_secrets_changed();

CREATE TRIGGER sealed_secret_updated AFTER UPDATE ON sealed
    FOR EACH ROW WHEN (OLD.kind = 'secret' OR NEW.kind = 'secret')
    EXECUTE FUNCTION runwarden_secrets_changed();

CREATE TRIGGER sealed_secret_deleted AFTER DELETE ON sealed
    FOR EACH ROW WHEN (OLD.kind = 'secret')
    EXECUTE FUNCTION runwarden_secrets_changed();
