-- The catalogue's version: one number that every change to the imported tool catalogue
-- raises in the same transaction as the change, whoever makes it (`mcp import` on another
-- node, an older build, a hand edit). A worker keeps the catalogue it read and reads it
-- again only when this number moved, instead of reading every tool for every run.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE catalogue_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT  NOT NULL
);

INSERT INTO catalogue_version (id, version) VALUES (1, 0);

CREATE FUNCTION runwarden_catalogue_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE catalogue_version SET version = version + 1 WHERE id = 1;
    RETURN NULL;
END
$$;

-- Once per statement: a replace deletes and inserts many rows in one transaction.
CREATE TRIGGER mcp_tools_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON mcp_tools
    FOR EACH STATEMENT EXECUTE FUNCTION runwarden_catalogue_changed();
