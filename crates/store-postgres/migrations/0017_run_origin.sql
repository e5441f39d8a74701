-- Who started a run (an API token's name or a console user; NULL on the command line)
-- and the tags it was started with (a JSON array of strings): what a policy may ask of a
-- run besides its agent. Written when the run is created, never changed.
-- Released migrations are never edited: a change is a new numbered file.
ALTER TABLE runs ADD COLUMN started_by TEXT;
ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
