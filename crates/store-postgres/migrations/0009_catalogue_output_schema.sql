-- M7 (amended): the outputSchema a tool declared, as JSON text exactly as the server sent
-- it (NULL when it declared none); a call's structuredContent is checked against it.
-- Released migrations are never edited: a change is a new numbered file.
ALTER TABLE mcp_tools ADD COLUMN output_schema_json TEXT;
