-- The catalogue's version: one number that every change to the imported tool catalogue
-- raises in the same transaction as the change, whoever makes it (`mcp import` in another
-- process, an older build, a hand edit). A worker keeps the catalogue it read and reads it
-- again only when this number moved, instead of reading every tool for every run.
-- Released migrations are never edited: a change is a new numbered file.
CREATE TABLE catalogue_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);

INSERT INTO catalogue_version (id, version) VALUES (1, 0);

CREATE TRIGGER mcp_tool_inserted AFTER INSERT ON mcp_tools
BEGIN
    UPDATE catalogue_version SET version = version + 1 WHERE id = 1;
END;

CREATE TRIGGER mcp_tool_updated AFTER UPDATE ON mcp_tools
BEGIN
    UPDATE catalogue_version SET version = version + 1 WHERE id = 1;
END;

CREATE TRIGGER mcp_tool_deleted AFTER DELETE ON mcp_tools
BEGIN
    UPDATE catalogue_version SET version = version + 1 WHERE id = 1;
END;
