//! `QueueStore` for PostgreSQL: a worker's claim of a queued run (SPEC R3), the requeue
//! after a retryable failure or a graceful stop, and the reaper's rescue of stale runs (R9).
//!
//! A claim is one statement: the oldest due queued row is picked `FOR UPDATE SKIP LOCKED`
//! and moved to `running` by the same UPDATE, so claimants on every node take different
//! rows without waiting for each other and each run has exactly one winner. Where the
//! answer depends on the row (a requeue that dead-letters, a rescue), the row is locked
//! with `SELECT ... FOR UPDATE` and changed by a guarded UPDATE in the same transaction.

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_runtime::RunState;
use runwarden_runtime::queue::{
    Claim, DeadLetter, QueueStore, Requeue, RequeueAnswer, Rescue, Rescued,
};
use runwarden_runtime::store::Run;
use runwarden_vault::store::StoreError;

use crate::PgStore;
use crate::failure::{Failure, finish};
use crate::run_store::{RUN_COLUMNS, read_run, run_row};

const REQUEUEING: &str = "requeueing a run";

#[async_trait]
impl QueueStore for PgStore {
    async fn run_claim(&self, params: Claim) -> Result<Option<Run>, StoreError> {
        self.with("claiming a queued run", async {
            let client = self.client().await?;
            // R3: one statement. SKIP LOCKED passes over rows another claimant holds; the
            // outer guard re-checks "queued and due" on the row as locked. The last
            // requeue's reason is cleared: the run is running again.
            let stmt = client
                .prepare_cached(&format!(
                    "UPDATE runs SET status = 'running', claimed_by = $1, lease_expires_ms = $2,
                         termination_reason = NULL, updated_ms = $3
                     WHERE id = (
                         SELECT id FROM runs WHERE status = 'queued' AND retry_at_ms <= $3
                         ORDER BY created_ms, id
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED
                     ) AND status = 'queued' AND retry_at_ms <= $3
                     RETURNING {RUN_COLUMNS}"
                ))
                .await?;
            let row = client
                .query_opt(
                    &stmt,
                    &[&params.owner, &params.lease_until_ms, &params.now_ms],
                )
                .await?;
            row.as_ref().map(run_row).transpose()
        })
        .await
    }

    async fn run_requeue(&self, params: Requeue) -> Result<RequeueAnswer, StoreError> {
        self.with(REQUEUEING, async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = async {
                let Some(run) = read_run(&*tx, &params.id, true).await? else {
                    return Ok(RequeueAnswer::LeaseLost);
                };
                if run.status == RunState::Cancelled {
                    // R4: cancelled is terminal; no retry path takes it.
                    return Ok(RequeueAnswer::AlreadyCancelled);
                }
                if run.status != RunState::Running || run.claimed_by.as_deref() != Some(&params.owner)
                {
                    // R3: only the segment holding the lease may requeue the run.
                    return Ok(RequeueAnswer::LeaseLost);
                }
                let (changed, answer) = match decide(&run, params.counts, params.max_requeues) {
                    None => {
                        let requeue_count = run.requeue_count.saturating_add(u32::from(params.counts));
                        let changed = tx
                            .execute(
                                "UPDATE runs SET status = 'queued', claimed_by = NULL, lease_expires_ms = NULL,
                                     retry_at_ms = $1, termination_reason = $2,
                                     requeue_count = requeue_count + $3, updated_ms = $4
                                 WHERE id = $5 AND status = 'running' AND claimed_by = $6",
                                &[
                                    &params.retry_at_ms,
                                    &params.reason,
                                    &i64::from(params.counts),
                                    &params.now_ms,
                                    &params.id,
                                    &params.owner,
                                ],
                            )
                            .await?;
                        (changed, RequeueAnswer::Requeued { requeue_count })
                    }
                    Some(code) => {
                        let reason = format!("{}: {}", code.as_str(), params.reason);
                        // R7: pending_effect stays, so the record shows the write that was in flight.
                        let changed = tx
                            .execute(
                                "UPDATE runs SET status = 'failed', termination_reason = $1, updated_ms = $2
                                 WHERE id = $3 AND status = 'running' AND claimed_by = $4",
                                &[&reason, &params.now_ms, &params.id, &params.owner],
                            )
                            .await?;
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
                Ok(answer)
            }
            .await;
            finish(tx, result).await
        })
        .await
    }

    async fn run_rescue_many(&self, params: Rescue) -> Result<Vec<Rescued>, StoreError> {
        self.with("rescuing stale runs", async {
            let stale: Vec<String> = {
                let client = self.client().await?;
                let rows = client
                    .query(
                        "SELECT id FROM runs WHERE status = 'running' AND lease_expires_ms < $1
                         ORDER BY lease_expires_ms, id LIMIT $2",
                        &[&params.now_ms, &i64::from(params.limit)],
                    )
                    .await?;
                rows.iter()
                    .map(|row| row.try_get(0))
                    .collect::<Result<_, _>>()?
            };
            let mut rescued = Vec::new();
            for id in stale {
                if let Some(action) = self.rescue_one(&id, &params).await? {
                    rescued.push(Rescued { id, action });
                }
            }
            Ok(rescued)
        })
        .await
    }
}

impl PgStore {
    /// Requeues or dead-letters one run if it is still stale, in a transaction of its own;
    /// `None` when a heartbeat, a settle or a cancel got there first (nothing changed).
    async fn rescue_one(
        &self,
        id: &str,
        params: &Rescue,
    ) -> Result<Option<RequeueAnswer>, Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let result = async {
            let Some(run) = read_run(&*tx, id, true).await? else {
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
            // R9: staleness and the owner are re-checked inside each update, so a heartbeat
            // that landed first (a renewed lease) wins over the reaper.
            let (changed, action) = match decide(&run, true, params.max_requeues) {
                None => {
                    let retry_at_ms = params
                        .now_ms
                        .saturating_add(backoff(params.backoff_base_ms, run.requeue_count));
                    let changed = tx
                        .execute(
                            "UPDATE runs SET status = 'queued', claimed_by = NULL, lease_expires_ms = NULL,
                                 retry_at_ms = $1, termination_reason = $2,
                                 requeue_count = requeue_count + 1, updated_ms = $3
                             WHERE id = $4 AND status = 'running' AND lease_expires_ms < $3
                                 AND claimed_by IS NOT DISTINCT FROM $5",
                            &[
                                &retry_at_ms,
                                &format!("the lease of {who} expired"),
                                &params.now_ms,
                                &id,
                                &old_owner,
                            ],
                        )
                        .await?;
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
                    let changed = tx
                        .execute(
                            "UPDATE runs SET status = 'failed', termination_reason = $1, updated_ms = $2
                             WHERE id = $3 AND status = 'running' AND lease_expires_ms < $2
                                 AND claimed_by IS NOT DISTINCT FROM $4",
                            &[
                                &format!("{}: {why}", code.as_str()),
                                &params.now_ms,
                                &id,
                                &old_owner,
                            ],
                        )
                        .await?;
                    (changed, RequeueAnswer::DeadLettered(code))
                }
            };
            if changed != 1 {
                return Ok(None);
            }
            Ok(Some(action))
        }
        .await;
        finish(tx, result).await
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_requeue_and_saturates() {
        assert_eq!(backoff(100, 0), 100);
        assert_eq!(backoff(100, 3), 800);
        assert_eq!(backoff(100, u32::MAX), i64::MAX);
        assert_eq!(backoff(-5, 2), 0, "a negative base means no delay");
    }
}
