-- O6: on PostgreSQL this migration adds the triggers that NOTIFY every node of each
-- committed run change. SQLite has no NOTIFY: SqliteStore publishes its own commits to
-- the in-process feed. The file exists so both backends keep the same migration numbers
-- and names; it changes nothing. Released migrations are never edited.
SELECT 1;
