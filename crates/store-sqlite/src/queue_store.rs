//! `QueueStore` for SQLite: a worker's claim of a queued run (R3), and applying the
//! runtime's retry decisions: a segment's requeue or dead letter, and the reaper's rescue
//! of stale runs (R9).
//!
//! Every transition is one guarded UPDATE whose affected-row count decides, so a claim
//! race across processes has exactly one winner. The store decides nothing about retries:
//! each apply's guard re-checks what the runtime's decision read (owner, `running`,
//! staleness, the requeue count, the pending effect), so a heartbeat, a cancel or another
//! reaper that lands first wins and the late decision changes nothing.

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::events::RunStarted;
use runwarden_runtime::queue::{
    Claim, Claimed, QueueStore, RequeueAnswer, RequeueApply, RescueApply,
};
use runwarden_runtime::rules::{claims, runs};
use runwarden_runtime::store::{Run, RunEvent};
use runwarden_runtime::{Change, RetryDecision, RunState, WORKER_FORGOTTEN_AFTER_MS};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::SqliteStore;
use crate::cached::Cached;
use crate::failure::Failure;
use crate::publish::publish_status;
use crate::run_store::{RUN_COLUMNS, read_events, run_columns, run_row};

const REQUEUEING: &str = "requeueing a run";
const RESCUING: &str = "rescuing a stale run";

#[async_trait]
impl QueueStore for SqliteStore {
    async fn run_claim(&self, params: Claim) -> Result<Option<Run>, StoreError> {
        let run = self
            .run("claiming a queued run", move |conn| claim(conn, &params))
            .await?;
        if let Some(run) = &run {
            publish_status(self.feed(), &run.id, run.status);
        }
        Ok(run)
    }

    async fn run_claim_many(&self, params: Claim, max: usize) -> Result<Vec<Claimed>, StoreError> {
        let claimed = self
            .run("claiming queued runs", move |conn| {
                let runs = claim_many(conn, &params, max)?;
                // After the commit: the claim holds each run, so no other segment appends
                // to it. A failed read leaves the segment to read the events itself. A run
                // the claim started had no events before its start.
                Ok(runs
                    .into_iter()
                    .map(|(run, started)| {
                        let history = match started {
                            Some(_) => Some(Vec::new()),
                            None => read_events(conn, &run.id, 0, 0).ok(),
                        };
                        Claimed {
                            run,
                            history,
                            started,
                        }
                    })
                    .collect::<Vec<_>>())
            })
            .await?;
        for claimed in &claimed {
            publish_status(self.feed(), &claimed.run.id, claimed.run.status);
            if let Some(started) = &claimed.started {
                self.feed().publish(Change::Appended {
                    run_id: started.run_id.clone(),
                    seq: started.seq,
                });
            }
        }
        Ok(claimed)
    }

    async fn run_requeue_apply(&self, params: RequeueApply) -> Result<RequeueAnswer, StoreError> {
        let run_id = params.id.clone();
        let answer = self
            .run(REQUEUEING, move |conn| requeue_apply(conn, &params))
            .await?;
        publish_requeue(self, &run_id, answer);
        Ok(answer)
    }

    async fn run_stale(&self, now_ms: i64, limit: u32) -> Result<Vec<Run>, StoreError> {
        self.run("finding stale runs", move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND lease_expires_ms < ?1
                 ORDER BY lease_expires_ms, id LIMIT ?2"
            ))?;
            let rows = stmt
                .query_map(params![now_ms, i64::from(limit)], run_columns)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(run_row).collect()
        })
        .await
    }

    async fn run_rescue_apply(&self, params: RescueApply) -> Result<bool, StoreError> {
        let run_id = params.id.clone();
        let decision = params.decision;
        let (applied, seq) = self
            .run(RESCUING, move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let applied = rescue_apply(&tx, &params)?;
                // R8: the reaper's dead letter is the run's end; its final event goes in
                // with it (the segment that held the run is gone).
                let seq = match claims::rescue_final_event(params.decision, &params.reason) {
                    Some(body) if applied => {
                        crate::final_event::append_final(&tx, &params.id, &body, params.now_ms)?
                    }
                    _ => None,
                };
                tx.commit()?;
                Ok((applied, seq))
            })
            .await?;
        if applied {
            publish_status(self.feed(), &run_id, claims::status_after(decision));
        }
        if let Some(seq) = seq {
            self.feed().publish(Change::Appended { run_id, seq });
        }
        Ok(applied)
    }

    async fn run_stopped_orphans(
        &self,
        expired_before_ms: i64,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        let written = self
            .run("recording the stop of cancelled runs", move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let ids = {
                    let mut stmt = tx.prepare_cached(
                        "SELECT id FROM runs WHERE status = 'cancelled'
                             AND lease_expires_ms IS NOT NULL AND lease_expires_ms < ?1
                         ORDER BY lease_expires_ms LIMIT ?2",
                    )?;
                    stmt.query_map(params![expired_before_ms, i64::from(limit)], |row| {
                        row.get::<_, String>(0)
                    })?
                    .collect::<Result<Vec<_>, _>>()?
                };
                let body = runwarden_runtime::events::stopped_orphan();
                let mut written = Vec::new();
                for id in ids {
                    if let Some(seq) = crate::final_event::append_final(&tx, &id, &body, now_ms)? {
                        written.push((id.clone(), seq));
                    }
                    // Looked at once: a cleared lease leaves the sweep's scope.
                    tx.execute_cached(
                        "UPDATE runs SET lease_expires_ms = NULL WHERE id = ?1 AND status = 'cancelled'",
                        [&id],
                    )?;
                }
                tx.commit()?;
                Ok(written)
            })
            .await?;
        for (run_id, seq) in &written {
            self.feed().publish(Change::Appended {
                run_id: run_id.clone(),
                seq: *seq,
            });
        }
        Ok(written.into_iter().map(|(id, _)| id).collect())
    }

    async fn worker_seen(&self, id: &str, now_ms: i64) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.run("recording a worker's presence", move |conn| {
            conn.execute_cached(
                "INSERT INTO workers (id, seen_ms) VALUES (?1, ?2)
                 ON CONFLICT (id) DO UPDATE SET seen_ms = MAX(seen_ms, excluded.seen_ms)",
                params![id, now_ms],
            )?;
            conn.execute_cached(
                "DELETE FROM workers WHERE seen_ms < ?1",
                [now_ms - WORKER_FORGOTTEN_AFTER_MS],
            )?;
            Ok(())
        })
        .await
    }

    async fn worker_last_seen(&self) -> Result<Option<i64>, StoreError> {
        self.run("reading when a worker was last seen", |conn| {
            Ok(conn.query_row_cached("SELECT MAX(seen_ms) FROM workers", [], |row| row.get(0))?)
        })
        .await
    }
}

/// O6: a requeued run is queued (and ready); a dead-lettered one failed.
fn publish_requeue(store: &SqliteStore, run_id: &str, answer: RequeueAnswer) {
    match answer {
        RequeueAnswer::Requeued { .. } => publish_status(store.feed(), run_id, RunState::Queued),
        RequeueAnswer::DeadLettered(_) => publish_status(store.feed(), run_id, RunState::Failed),
        RequeueAnswer::AlreadyCancelled | RequeueAnswer::LeaseLost => {}
    }
}

/// The oldest due queued run (of the given agents, a JSON list, or any). The claim order's
/// own index is named: without it SQLite's planner prefers an index that leads with the
/// state, and sorts every due queued run for each claim.
const DUE: &str = "SELECT id FROM runs INDEXED BY runs_queued_order
     WHERE status = 'queued' AND retry_at_ms <= ?1
     AND (?2 IS NULL OR agent IN (SELECT value FROM json_each(?2)))
     ORDER BY created_ms, id LIMIT 1";

/// R3: the oldest due queued run of the claim's agents, claimed in one immediate
/// transaction that raises its claim epoch. The run is answered only once the commit is
/// confirmed: a failed commit may still have landed (an I/O error at commit), so the row
/// is re-read, and the claim is acted on only if the row holds it.
fn claim(conn: &mut Connection, params: &Claim) -> Result<Option<Run>, Failure> {
    // The answer carries no event: this claim records none, whatever `start` says.
    let params = Claim {
        start: false,
        ..params.clone()
    };
    Ok(claim_many(conn, &params, 1)?.pop().map(|(run, _)| run))
}

/// A claimed run, and the `run_started` event the claim recorded for it.
type ClaimedRun = (Run, Option<RunEvent>);

/// Up to `max` of the oldest due runs, each claimed as [`claim`] claims one, in one
/// transaction: all of them are claimed, or none. With `start`, each claimed run with no
/// events gets its `run_started` in the same transaction.
fn claim_many(
    conn: &mut Connection,
    params: &Claim,
    max: usize,
) -> Result<Vec<ClaimedRun>, Failure> {
    let agents = params
        .agents
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::new("claiming a queued run", e))?;
    // A look without the write lock first: an idle worker's wake-up takes no lock.
    let due = |conn: &Connection| -> Result<Option<String>, Failure> {
        Ok(conn
            .prepare_cached(DUE)?
            .query_row(params![params.now_ms, agents], |row| row.get(0))
            .optional()?)
    };
    if max == 0 || due(conn)?.is_none() {
        return Ok(Vec::new());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut runs = Vec::new();
    // Under the write lock nobody else can claim between a read and its update.
    while runs.len() < max {
        let Some(id) = due(&tx)? else {
            break;
        };
        // The last requeue's reason is cleared: the run is running again.
        tx.execute_cached(
            "UPDATE runs SET status = 'running', claimed_by = ?1, lease_expires_ms = ?2,
                 termination_reason = NULL, updated_ms = ?3, claim_epoch = claim_epoch + 1
             WHERE id = ?4 AND status = 'queued'",
            params![params.owner, params.lease_until_ms, params.now_ms, id],
        )?;
        let columns = tx.query_row_cached(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
            [&id],
            run_columns,
        )?;
        let run = run_row(columns)?;
        let started = match params.start {
            true => start(&tx, &run, params)?,
            false => None,
        };
        runs.push((run, started));
    }
    if runs.is_empty() {
        return Ok(runs); // dropping the transaction rolls it back
    }
    let committed = tx.commit().map(|()| runs.clone()).map_err(Failure::from);
    // One transaction: when the first claim landed, they all did.
    crate::confirm::or_reread(conn, "claiming a queued run", committed, |conn| {
        Ok(crate::confirm::claim_landed(conn, &runs[0].0)?.map(|_| runs.clone()))
    })
}

/// A claimed run's `run_started`, recorded in the claim's transaction when the run has
/// no events yet (a resumed run's segment records `run_resumed` itself).
fn start(conn: &Connection, run: &Run, params: &Claim) -> Result<Option<RunEvent>, Failure> {
    let Some(body) = RunStarted::at_claim(run, &params.owner) else {
        return Ok(None);
    };
    let payload = body.to_payload();
    let inserted = conn
        .query_row_cached(
            "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
             SELECT ?1, 1, ?2, ?3, ?4
             WHERE NOT EXISTS (SELECT 1 FROM run_events WHERE run_id = ?1)
             RETURNING seq",
            params![run.id, body.kind(), payload.to_string(), params.now_ms],
            |row| row.get::<_, i64>(0),
        )
        .optional()?;
    Ok(inserted.map(|seq| RunEvent {
        run_id: run.id.clone(),
        seq,
        kind: body.kind().to_string(),
        payload,
        time_ms: params.now_ms,
    }))
}

/// R9: applies a segment's decision, guarded by what it read: the owner holds the lease
/// of a running run with the same requeue count and pending effect. When the guard
/// matches nothing, the row says whether a cancel won (R4) or the lease is lost (R3).
fn requeue_apply(conn: &Connection, params: &RequeueApply) -> Result<RequeueAnswer, Failure> {
    const GUARD: &str = "id = ?1 AND status = 'running' AND claimed_by = ?2
        AND requeue_count = ?3 AND pending_effect IS ?4 AND claim_epoch = ?5";
    let changed = match params.decision {
        RetryDecision::Requeue { retry_at_ms } => conn.execute(
            &format!(
                "UPDATE runs SET status = 'queued', claimed_by = NULL, lease_expires_ms = NULL,
                         retry_at_ms = ?6, termination_reason = ?7,
                         requeue_count = requeue_count + ?8, updated_ms = ?9
                     WHERE {GUARD}"
            ),
            params![
                params.id,
                params.owner,
                params.requeue_count,
                params.pending_effect,
                params.epoch,
                retry_at_ms,
                params.reason,
                u32::from(params.counts),
                params.now_ms
            ],
        )?,
        RetryDecision::DeadLetter(_) => {
            // R7: pending_effect stays, so the record shows the write that was in flight.
            conn.execute(
                &format!(
                    "UPDATE runs SET status = 'failed', termination_reason = ?6, updated_ms = ?7
                     WHERE {GUARD}"
                ),
                params![
                    params.id,
                    params.owner,
                    params.requeue_count,
                    params.pending_effect,
                    params.epoch,
                    params.reason,
                    params.now_ms
                ],
            )?
        }
    };
    if changed == 1 {
        return Ok(claims::applied(
            params.decision,
            params.requeue_count,
            params.counts,
        ));
    }
    let status: Option<String> = conn
        .query_row_cached(
            "SELECT status FROM runs WHERE id = ?1",
            [&params.id],
            |row| row.get(0),
        )
        .optional()?;
    // No retry path takes a cancelled run.
    Ok(runs::lost_row(status.as_deref().and_then(RunState::parse)).into())
}

/// R9: applies the reaper's decision to one run if it is still stale and unchanged since
/// it was read; false when a heartbeat, a settle, a cancel or another reaper got there
/// first (nothing changed).
fn rescue_apply(conn: &Connection, params: &RescueApply) -> Result<bool, Failure> {
    const GUARD: &str = "id = ?1 AND status = 'running' AND lease_expires_ms < ?2
        AND claimed_by IS ?3 AND requeue_count = ?4 AND pending_effect IS ?5";
    let changed = match params.decision {
        RetryDecision::Requeue { retry_at_ms } => conn.execute(
            &format!(
                "UPDATE runs SET status = 'queued', claimed_by = NULL, lease_expires_ms = NULL,
                     retry_at_ms = ?6, termination_reason = ?7,
                     requeue_count = requeue_count + 1, updated_ms = ?2
                 WHERE {GUARD}"
            ),
            params![
                params.id,
                params.now_ms,
                params.owner,
                params.requeue_count,
                params.pending_effect,
                retry_at_ms,
                params.reason
            ],
        )?,
        // R7: pending_effect stays, so the record shows the write that was in flight.
        RetryDecision::DeadLetter(_) => conn.execute(
            &format!(
                "UPDATE runs SET status = 'failed', termination_reason = ?6, updated_ms = ?2
                 WHERE {GUARD}"
            ),
            params![
                params.id,
                params.now_ms,
                params.owner,
                params.requeue_count,
                params.pending_effect,
                params.reason
            ],
        )?,
    };
    Ok(changed == 1)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::DUE;

    /// A claim walks the queued runs in claim order and stops at the first due one: no
    /// sort of the whole queue for each claim.
    #[test]
    fn a_claim_reads_the_queue_in_order_without_sorting_it() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::migrate::migrate(&mut conn).unwrap();
        let plan = crate::plan::query_plan(&conn, DUE, rusqlite::params![0, None::<String>]);
        assert!(plan.contains("runs_queued_order"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }
}
