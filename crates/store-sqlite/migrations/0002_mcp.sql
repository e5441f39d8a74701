-- MCP: the imported tool catalogue (M8-M10) and per-server liveness (M11).
-- Released migrations are never edited: a change is a new numbered file.

-- One row per imported tool. A tool is either usable (schema_json holds the normalised
-- schema, M8) or refused (refusal says why): exactly one of the two is set. local_name is
-- what the model sees (M9) and is unique across every server.
CREATE TABLE mcp_tools (
    server      TEXT    NOT NULL,
    remote_name TEXT    NOT NULL,
    local_name  TEXT    NOT NULL UNIQUE,
    description TEXT,
    effect      TEXT    NOT NULL,
    schema_json TEXT,
    refusal     TEXT,
    imported_ms INTEGER NOT NULL,
    PRIMARY KEY (server, remote_name),
    CHECK ((schema_json IS NULL) <> (refusal IS NULL))
);

-- Liveness only (M11): the last success and the last failure; the run's events are the
-- call log.
CREATE TABLE mcp_health (
    server          TEXT PRIMARY KEY,
    last_success_ms INTEGER,
    last_failure_ms INTEGER,
    last_error      TEXT
);
