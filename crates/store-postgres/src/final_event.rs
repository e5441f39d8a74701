//! R8: a run's final event written by the store itself, inside the transaction that ends
//! the run, when no segment is there to write it (a cancel while queued or waiting for a
//! decision, the reaper's dead letter). The log never holds two: the insert is skipped
//! when the run already has a final event. The caller's transaction holds the run row's
//! lock (its guarded UPDATE), so appends to one run do not race here.

use runwarden_runtime::EventBody;
use runwarden_runtime::events::FINAL_KINDS;
use tokio_postgres::GenericClient;

use crate::failure::Failure;

/// Appends `body` (a final kind) to run `run_id`'s log unless it has a final event
/// already; the new sequence number, or `None` when skipped.
pub(crate) async fn append_final(
    conn: &impl GenericClient,
    run_id: &str,
    body: &EventBody,
    now_ms: i64,
) -> Result<Option<i64>, Failure> {
    let finals: Vec<String> = FINAL_KINDS.iter().map(|k| (*k).to_string()).collect();
    let payload = body.to_payload().to_string();
    let row = conn
        .query_opt(
            "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
             SELECT $1::TEXT,
                    (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = $1::TEXT),
                    $2::TEXT, $3::TEXT, $4::BIGINT
             WHERE NOT EXISTS (SELECT 1 FROM run_events
                               WHERE run_id = $1::TEXT AND kind = ANY($5::TEXT[]))
             RETURNING seq",
            &[&run_id, &body.kind(), &payload, &now_ms, &finals],
        )
        .await?;
    Ok(match row {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}
