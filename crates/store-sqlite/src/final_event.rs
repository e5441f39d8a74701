//! R8: a run's final event written by the store itself, inside the transaction that ends
//! the run, when no segment is there to write it (a cancel while queued or waiting for a
//! decision, the reaper's dead letter). The log never holds two: the insert is skipped
//! when the run already has a final event.

use runwarden_runtime::EventBody;
use runwarden_runtime::events::FINAL_KINDS;
use rusqlite::{Connection, params};

use crate::failure::Failure;

/// Appends `body` (a final kind) to run `run_id`'s log unless it has a final event
/// already; the new sequence number, or `None` when skipped.
pub(crate) fn append_final(
    conn: &Connection,
    run_id: &str,
    body: &EventBody,
    now_ms: i64,
) -> Result<Option<i64>, Failure> {
    debug_assert!(FINAL_KINDS.contains(&body.kind()));
    let finals = serde_json::to_string(&FINAL_KINDS).unwrap_or_default();
    let mut stmt = conn.prepare_cached(
        "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
         SELECT ?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = ?1),
                ?2, ?3, ?4
         WHERE NOT EXISTS (SELECT 1 FROM run_events
                           WHERE run_id = ?1 AND kind IN (SELECT value FROM json_each(?5)))
         RETURNING seq",
    )?;
    // Stepped to its end: a statement error after the row is an error, never a sequence.
    let seq = crate::confirm::returning_one(
        &mut stmt,
        params![
            run_id,
            body.kind(),
            body.to_payload().to_string(),
            now_ms,
            finals
        ],
        |row| row.get(0),
    )?;
    Ok(seq)
}
