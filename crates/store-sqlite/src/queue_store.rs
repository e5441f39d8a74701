//! `QueueStore` for SQLite: a worker's claim of a queued run (SPEC R3), the requeue after a
//! retryable failure or a graceful stop, and the reaper's rescue of stale runs (R9).
//!
//! Every transition is one guarded UPDATE whose affected-row count decides, so a claim
//! race across processes has exactly one winner and a heartbeat that lands first wins over
//! the reaper. Where the answer depends on the row (a requeue that dead-letters, a rescue),
//! the read and the guarded update share one `BEGIN IMMEDIATE` transaction.

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_runtime::RunState;
use runwarden_runtime::queue::{
    Claim, DeadLetter, QueueStore, Requeue, RequeueAnswer, Rescue, Rescued,
};
use runwarden_runtime::store::Run;
use runwarden_vault::store::StoreError;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::SqliteStore;
use crate::failure::Failure;
use crate::run_store::{RUN_COLUMNS, publish_status, run_columns, run_row};

/// How many due runs one claim round considers: a claimant that loses a run to another
/// process tries the next one instead of giving up.
const CLAIM_CANDIDATES: i64 = 8;
/// How many rounds a claim selects candidates before answering "none" for now; the worker
/// polls again, so a claim never spins for long under heavy contention.
const CLAIM_ROUNDS: usize = 4;

const REQUEUEING: &str = "requeueing a run";

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

    async fn run_requeue(&self, params: Requeue) -> Result<RequeueAnswer, StoreError> {
        let run_id = params.id.clone();
        let answer = self
            .run(REQUEUEING, move |conn| requeue(conn, &params))
            .await?;
        publish_requeue(self, &run_id, answer);
        Ok(answer)
    }

    async fn run_rescue_many(&self, params: Rescue) -> Result<Vec<Rescued>, StoreError> {
        let rescued = self
            .run("rescuing stale runs", move |conn| {
                rescue_many(conn, &params)
            })
            .await?;
        for one in &rescued {
            publish_requeue(self, &one.id, one.action);
        }
        Ok(rescued)
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

/// R3: the oldest due queued run, claimed with a guarded `queued -> running` update.
fn claim(conn: &Connection, params: &Claim) -> Result<Option<Run>, Failure> {
    let mut select = conn.prepare_cached(
        "SELECT id FROM runs WHERE status = 'queued' AND retry_at_ms <= ?1
         ORDER BY created_ms, id LIMIT ?2",
    )?;
    // The guard re-checks "queued and due": between the select and this update another
    // claimant may have won the run (and even requeued it with a later retry). The last
    // requeue's reason is cleared: the run is running again.
    let mut update = conn.prepare_cached(&format!(
        "UPDATE runs SET status = 'running', claimed_by = ?1, lease_expires_ms = ?2,
             termination_reason = NULL, updated_ms = ?3
         WHERE id = ?4 AND status = 'queued' AND retry_at_ms <= ?3
         RETURNING {RUN_COLUMNS}"
    ))?;
    for _ in 0..CLAIM_ROUNDS {
        let candidates = select
            .query_map(params![params.now_ms, CLAIM_CANDIDATES], |row| {
                row.get::<_, String>(0)
            })?
            .collect::<Result<Vec<_>, _>>()?;
        if candidates.is_empty() {
            return Ok(None);
        }
        for id in candidates {
            let claimed = update
                .query_row(
                    params![params.owner, params.lease_until_ms, params.now_ms, id],
                    run_columns,
                )
                .optional()?;
            if let Some(columns) = claimed {
                return run_row(columns).map(Some);
            }
        }
    }
    Ok(None)
}

/// R9: back to the queue, or dead-lettered, decided on the row read inside the transaction.
fn requeue(conn: &mut Connection, params: &Requeue) -> Result<RequeueAnswer, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(run) = read_run(&tx, &params.id)? else {
        return Ok(RequeueAnswer::LeaseLost);
    };
    if run.status == RunState::Cancelled {
        // R4: cancelled is terminal; no retry path takes it.
        return Ok(RequeueAnswer::AlreadyCancelled);
    }
    if run.status != RunState::Running || run.claimed_by.as_deref() != Some(&params.owner) {
        // R3: only the segment holding the lease may requeue the run.
        return Ok(RequeueAnswer::LeaseLost);
    }
    let (changed, answer) = match decide(&run, params.counts, params.max_requeues) {
        None => {
            let requeue_count = run.requeue_count.saturating_add(u32::from(params.counts));
            let changed = tx.execute(
                "UPDATE runs SET status = 'queued', claimed_by = NULL, lease_expires_ms = NULL,
                     retry_at_ms = ?1, termination_reason = ?2,
                     requeue_count = requeue_count + ?3, updated_ms = ?4
                 WHERE id = ?5 AND status = 'running' AND claimed_by = ?6",
                params![
                    params.retry_at_ms,
                    params.reason,
                    i64::from(params.counts),
                    params.now_ms,
                    params.id,
                    params.owner
                ],
            )?;
            (changed, RequeueAnswer::Requeued { requeue_count })
        }
        Some(code) => {
            let reason = format!("{}: {}", code.as_str(), params.reason);
            // R7: pending_effect stays, so the record shows the write that was in flight.
            let changed = tx.execute(
                "UPDATE runs SET status = 'failed', termination_reason = ?1, updated_ms = ?2
                 WHERE id = ?3 AND status = 'running' AND claimed_by = ?4",
                params![reason, params.now_ms, params.id, params.owner],
            )?;
            (changed, RequeueAnswer::DeadLettered(code))
        }
    };
    if changed != 1 {
        return Err(StoreError::new(
            REQUEUEING,
            format!(
                "run {} changed inside the requeue's transaction: retry the requeue",
                params.id
            ),
        )
        .into());
    }
    tx.commit()?;
    Ok(answer)
}

/// R9: every stale running run, oldest lease first, each in a transaction of its own.
fn rescue_many(conn: &mut Connection, params: &Rescue) -> Result<Vec<Rescued>, Failure> {
    let stale = conn
        .prepare_cached(
            "SELECT id FROM runs WHERE status = 'running' AND lease_expires_ms < ?1
             ORDER BY lease_expires_ms, id LIMIT ?2",
        )?
        .query_map(params![params.now_ms, i64::from(params.limit)], |row| {
            row.get::<_, String>(0)
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut rescued = Vec::new();
    for id in stale {
        if let Some(action) = rescue_one(conn, &id, params)? {
            rescued.push(Rescued { id, action });
        }
    }
    Ok(rescued)
}

/// Requeues or dead-letters one run if it is still stale; `None` when a heartbeat, a
/// settle or a cancel got there first (nothing changed).
fn rescue_one(
    conn: &mut Connection,
    id: &str,
    params: &Rescue,
) -> Result<Option<RequeueAnswer>, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(run) = read_run(&tx, id)? else {
        return Ok(None);
    };
    let stale = run.status == RunState::Running
        && run
            .lease_expires_ms
            .is_some_and(|until| until < params.now_ms);
    if !stale {
        return Ok(None);
    }
    let old_owner = run.claimed_by.as_deref();
    let who = old_owner.unwrap_or("no segment");
    // R9: staleness and the owner are re-checked inside each update, so a heartbeat that
    // landed first (a renewed lease) wins over the reaper.
    let (changed, action) = match decide(&run, true, params.max_requeues) {
        None => {
            let retry_at_ms = params
                .now_ms
                .saturating_add(backoff(params.backoff_base_ms, run.requeue_count));
            let changed = tx.execute(
                "UPDATE runs SET status = 'queued', claimed_by = NULL, lease_expires_ms = NULL,
                     retry_at_ms = ?1, termination_reason = ?2,
                     requeue_count = requeue_count + 1, updated_ms = ?3
                 WHERE id = ?4 AND status = 'running' AND lease_expires_ms < ?3
                     AND claimed_by IS ?5",
                params![
                    retry_at_ms,
                    format!("the lease of {who} expired"),
                    params.now_ms,
                    id,
                    old_owner
                ],
            )?;
            let requeue_count = run.requeue_count.saturating_add(1);
            (changed, RequeueAnswer::Requeued { requeue_count })
        }
        Some(code) => {
            let why = match code {
                DeadLetter::FencedWrite => format!(
                    "the lease of {who} expired while a {} was in flight; it may have run, \
                     so the run is never retried",
                    Effect::NonIdempotentWrite.as_str()
                ),
                DeadLetter::NotRetryable => format!(
                    "the lease of {who} expired and the run has no stored request to retry from"
                ),
                DeadLetter::RetriesExhausted => format!(
                    "the lease of {who} expired after {} requeues (at most {})",
                    run.requeue_count, params.max_requeues
                ),
            };
            // R7: pending_effect stays, so the record shows the write that was in flight.
            let changed = tx.execute(
                "UPDATE runs SET status = 'failed', termination_reason = ?1, updated_ms = ?2
                 WHERE id = ?3 AND status = 'running' AND lease_expires_ms < ?2
                     AND claimed_by IS ?4",
                params![
                    format!("{}: {why}", code.as_str()),
                    params.now_ms,
                    id,
                    old_owner
                ],
            )?;
            (changed, RequeueAnswer::DeadLettered(code))
        }
    };
    if changed != 1 {
        return Ok(None);
    }
    tx.commit()?;
    Ok(Some(action))
}

/// R9: why a run held by its segment may not go back to the queue; `None` means requeue.
fn decide(run: &Run, counts: bool, max_requeues: u32) -> Option<DeadLetter> {
    if run.pending_effect.as_deref() == Some(Effect::NonIdempotentWrite.as_str()) {
        // R9: the write may have run; it is never retried, whatever the budget. An
        // idempotent write may run again, so it does not stop a requeue.
        Some(DeadLetter::FencedWrite)
    } else if run.request.is_none() {
        Some(DeadLetter::NotRetryable)
    } else if counts && run.requeue_count >= max_requeues {
        Some(DeadLetter::RetriesExhausted)
    } else {
        None
    }
}

/// R9: `base * 2^requeues`, saturating; no jitter, so the store stays deterministic.
fn backoff(base_ms: i64, requeues: u32) -> i64 {
    let factor = 2_i64.checked_pow(requeues).unwrap_or(i64::MAX);
    base_ms.max(0).saturating_mul(factor)
}

/// Run `id` inside the caller's transaction.
fn read_run(conn: &Connection, id: &str) -> Result<Option<Run>, Failure> {
    let columns = conn
        .query_row(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
            [id],
            run_columns,
        )
        .optional()?;
    columns.map(run_row).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_requeue_and_saturates() {
        assert_eq!(backoff(100, 0), 100);
        assert_eq!(backoff(100, 1), 200);
        assert_eq!(backoff(100, 3), 800);
        assert_eq!(backoff(100, 62), i64::MAX);
        assert_eq!(backoff(100, u32::MAX), i64::MAX);
        assert_eq!(backoff(-5, 2), 0, "a negative base means no delay");
    }
}
