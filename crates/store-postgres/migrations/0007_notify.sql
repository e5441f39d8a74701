-- O6: every committed run change is announced to every node through NOTIFY on the
-- channel runwarden_changes. PostgreSQL delivers a notification only when its transaction
-- commits, so no node hears of a change before it is durable. Released migrations are
-- never edited: a change is a new numbered file.
--
-- Payloads are small JSON objects the store's listener parses into runtime Changes:
--   {"k":"status","id":RUN,"status":STATUS}  a run was created or its status changed
--   {"k":"ready"}                            a queued run may be claimed
--   {"k":"appended","id":RUN,"seq":SEQ}      an event was appended

CREATE FUNCTION runwarden_notify_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runwarden_changes',
        json_build_object('k', 'status', 'id', NEW.id, 'status', NEW.status)::text);
    IF NEW.status = 'queued' THEN
        PERFORM pg_notify('runwarden_changes', '{"k":"ready"}');
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION runwarden_notify_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runwarden_changes',
        json_build_object('k', 'appended', 'id', NEW.run_id, 'seq', NEW.seq)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_notify_insert AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION runwarden_notify_run();

CREATE TRIGGER runs_notify_status AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION runwarden_notify_run();

CREATE TRIGGER run_events_notify AFTER INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION runwarden_notify_event();
