-- MCP: what each server was last found to speak, so a new process does not probe
-- server/discover again before its time is up (the server's ttlMs, or a day for a server
-- that predates 2026-07-28). Forgotten after a failure. A cache: losing it costs a probe.
CREATE TABLE mcp_protocol (
    server   TEXT    PRIMARY KEY,
    url      TEXT    NOT NULL,
    protocol TEXT    NOT NULL,
    tools    BOOLEAN NOT NULL,
    until_ms BIGINT NOT NULL
);
