-- A decision whose asker waits within its call (a gateway client's approval): the run
-- stays running and keeps its lease while it waits, instead of parking.
-- Released migrations are never edited: a change is a new numbered file.
ALTER TABLE decisions ADD COLUMN in_call INTEGER NOT NULL DEFAULT 0;
