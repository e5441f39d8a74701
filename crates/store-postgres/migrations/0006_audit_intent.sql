-- V7 (amended): a completion row names the intent row (`http_call_started`) committed
-- before its transfer. NULL for every other row, and for every row written before this
-- migration, whose hash never covered the column.
ALTER TABLE audit_log ADD COLUMN intent_id BIGINT;

-- `audit list` and `audit verify` ask which intents have a completion.
CREATE INDEX audit_log_intent ON audit_log (intent_id) WHERE intent_id IS NOT NULL;
