//! `QueueStore` for PostgreSQL: a worker's claim of a queued run (R3), and applying the
//! runtime's retry decisions: a segment's requeue or dead letter, and the reaper's rescue
//! of stale runs (R9).
//!
//! A claim is one statement: the oldest due queued row is picked `FOR UPDATE SKIP LOCKED`
//! and moved to `running` by the same UPDATE, so claimants on every node take different
//! rows without waiting for each other and each run has exactly one winner. The store
//! decides nothing about retries: each apply is one UPDATE whose guard re-checks what the
//! runtime's decision read (owner, `running`, staleness, the requeue count, the pending
//! effect), so a heartbeat, a cancel or another reaper on any node that lands first wins
//! and the late decision changes nothing.

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::events::RunStarted;
use runwarden_runtime::queue::{
    Claim, Claimed, QueueStore, RequeueAnswer, RequeueApply, RescueApply,
};
use runwarden_runtime::rules::{claims, runs};
use runwarden_runtime::store::{Run, RunEvent};
use runwarden_runtime::{RetryDecision, RunState, WORKER_FORGOTTEN_AFTER_MS};
use tokio_postgres::GenericClient;

use crate::PgStore;
use crate::connection::Conn;
use crate::failure::{Failure, finish};
use crate::flight::{begin_with, commit_with, rollback};
use crate::run_store::{RUN_COLUMNS, run_row};

const REQUEUEING: &str = "requeueing a run";

#[async_trait]
impl QueueStore for PgStore {
    async fn run_claim(&self, params: Claim) -> Result<Option<Run>, StoreError> {
        // The answer carries no event, so this claim records none, whatever `start` says.
        let params = Claim {
            start: false,
            ..params
        };
        Ok(self
            .claim_up_to("claiming a queued run", params, 1)
            .await?
            .pop()
            .map(|(run, _)| run))
    }

    async fn run_claim_many(&self, params: Claim, max: usize) -> Result<Vec<Claimed>, StoreError> {
        let runs = self
            .claim_up_to("claiming queued runs", params, max)
            .await?;
        Ok(runs
            .into_iter()
            .map(|(run, started)| Claimed {
                run,
                // A run the claim started had no events before its start.
                history: started.as_ref().map(|_| Vec::new()),
                started,
            })
            .collect())
    }

    async fn run_requeue_apply(&self, params: RequeueApply) -> Result<RequeueAnswer, StoreError> {
        self.with(REQUEUEING, async {
            let client = self.client().await?;
            let requeue_count = i64::from(params.requeue_count);
            // R9: the guard is what the decision read: the owner holds the lease of a
            // running run with the same requeue count and pending effect.
            let changed = match params.decision {
                RetryDecision::Requeue { retry_at_ms } => {
                    client
                        .execute(
                            "UPDATE runs SET status = 'queued', claimed_by = NULL,
                                 lease_expires_ms = NULL, retry_at_ms = $5,
                                 termination_reason = $6, requeue_count = requeue_count + $7,
                                 updated_ms = $8
                             WHERE id = $1 AND status = 'running' AND claimed_by = $2
                                 AND requeue_count = $3
                                 AND pending_effect IS NOT DISTINCT FROM $4
                                 AND claim_epoch = $9",
                            &[
                                &params.id,
                                &params.owner,
                                &requeue_count,
                                &params.pending_effect,
                                &retry_at_ms,
                                &params.reason,
                                &i64::from(params.counts),
                                &params.now_ms,
                                &params.epoch,
                            ],
                        )
                        .await?
                }
                // R7: pending_effect stays, so the record shows the write that was in flight.
                RetryDecision::DeadLetter(_) => {
                    client
                        .execute(
                            "UPDATE runs SET status = 'failed', termination_reason = $5,
                                 updated_ms = $6
                             WHERE id = $1 AND status = 'running' AND claimed_by = $2
                                 AND requeue_count = $3
                                 AND pending_effect IS NOT DISTINCT FROM $4
                                 AND claim_epoch = $7",
                            &[
                                &params.id,
                                &params.owner,
                                &requeue_count,
                                &params.pending_effect,
                                &params.reason,
                                &params.now_ms,
                                &params.epoch,
                            ],
                        )
                        .await?
                }
            };
            if changed == 1 {
                return Ok(claims::applied(
                    params.decision,
                    params.requeue_count,
                    params.counts,
                ));
            }
            let status: Option<String> = client
                .query_opt("SELECT status FROM runs WHERE id = $1", &[&params.id])
                .await?
                .map(|row| row.try_get(0))
                .transpose()?;
            // No retry path takes a cancelled run.
            Ok(runs::lost_row(status.as_deref().and_then(RunState::parse)).into())
        })
        .await
    }

    async fn run_stale(&self, now_ms: i64, limit: u32) -> Result<Vec<Run>, StoreError> {
        self.with("finding stale runs", async {
            let client = self.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {RUN_COLUMNS} FROM runs
                         WHERE status = 'running' AND lease_expires_ms < $1
                         ORDER BY lease_expires_ms, id LIMIT $2"
                    ),
                    &[&now_ms, &i64::from(limit)],
                )
                .await?;
            rows.iter().map(run_row).collect()
        })
        .await
    }

    async fn run_rescue_apply(&self, params: RescueApply) -> Result<bool, StoreError> {
        self.with("rescuing a stale run", async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = rescue_apply(&*tx, &params).await;
            finish(tx, result).await
        })
        .await
    }

    async fn run_stopped_orphans(
        &self,
        expired_before_ms: i64,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        self.with("recording the stop of cancelled runs", async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = async {
                // The rows stay locked until the commit; another reaper skips them.
                let rows = tx
                    .query(
                        "SELECT id FROM runs WHERE status = 'cancelled'
                             AND lease_expires_ms IS NOT NULL AND lease_expires_ms < $1
                         ORDER BY lease_expires_ms LIMIT $2
                         FOR UPDATE SKIP LOCKED",
                        &[&expired_before_ms, &i64::from(limit)],
                    )
                    .await?;
                let body = runwarden_runtime::events::stopped_orphan();
                let mut written = Vec::new();
                for row in rows {
                    let id: String = row.try_get(0)?;
                    if crate::final_event::append_final(&*tx, &id, &body, now_ms)
                        .await?
                        .is_some()
                    {
                        written.push(id.clone());
                    }
                    // Looked at once: a cleared lease leaves the sweep's scope.
                    tx.execute(
                        "UPDATE runs SET lease_expires_ms = NULL WHERE id = $1 AND status = 'cancelled'",
                        &[&id],
                    )
                    .await?;
                }
                Ok(written)
            }
            .await;
            finish(tx, result).await
        })
        .await
    }

    async fn worker_seen(&self, id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.with("recording a worker's presence", async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO workers (id, seen_ms) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET seen_ms = GREATEST(workers.seen_ms, EXCLUDED.seen_ms)",
                    &[&id, &now_ms],
                )
                .await?;
            let forgotten = now_ms - WORKER_FORGOTTEN_AFTER_MS;
            client
                .execute("DELETE FROM workers WHERE seen_ms < $1", &[&forgotten])
                .await?;
            Ok(())
        })
        .await
    }

    async fn worker_last_seen(&self) -> Result<Option<i64>, StoreError> {
        self.with("reading when a worker was last seen", async {
            let client = self.client().await?;
            let row = client
                .query_one("SELECT MAX(seen_ms) FROM workers", &[])
                .await?;
            Ok(row.try_get(0)?)
        })
        .await
    }

    async fn run_counts_fold(&self) -> Result<u64, StoreError> {
        self.with("moving the ended runs' counts", async {
            let mut client = self.client().await?;
            crate::run_counts::fold(&mut client).await
        })
        .await
    }
}

/// R9: the reaper's guarded rescue inside the caller's transaction; R8: a dead letter
/// appends the run's final event with it (the segment that held the run is gone).
async fn rescue_apply(conn: &impl GenericClient, params: &RescueApply) -> Result<bool, Failure> {
    let requeue_count = i64::from(params.requeue_count);
    // R9: still stale, still held by the same owner with the same count and fence:
    // a heartbeat (or a fence, which renews the lease) that landed first wins.
    let changed = match params.decision {
        RetryDecision::Requeue { retry_at_ms } => {
            conn.execute(
                "UPDATE runs SET status = 'queued', claimed_by = NULL,
                         lease_expires_ms = NULL, retry_at_ms = $6,
                         termination_reason = $7, requeue_count = requeue_count + 1,
                         updated_ms = $2
                     WHERE id = $1 AND status = 'running' AND lease_expires_ms < $2
                         AND claimed_by IS NOT DISTINCT FROM $3
                         AND requeue_count = $4
                         AND pending_effect IS NOT DISTINCT FROM $5",
                &[
                    &params.id,
                    &params.now_ms,
                    &params.owner,
                    &requeue_count,
                    &params.pending_effect,
                    &retry_at_ms,
                    &params.reason,
                ],
            )
            .await?
        }
        // R7: pending_effect stays, so the record shows the write that was in flight.
        RetryDecision::DeadLetter(_) => {
            conn.execute(
                "UPDATE runs SET status = 'failed', termination_reason = $6,
                         updated_ms = $2
                     WHERE id = $1 AND status = 'running' AND lease_expires_ms < $2
                         AND claimed_by IS NOT DISTINCT FROM $3
                         AND requeue_count = $4
                         AND pending_effect IS NOT DISTINCT FROM $5",
                &[
                    &params.id,
                    &params.now_ms,
                    &params.owner,
                    &requeue_count,
                    &params.pending_effect,
                    &params.reason,
                ],
            )
            .await?
        }
    };
    if changed == 1
        && let Some(body) = claims::rescue_final_event(params.decision, &params.reason)
    {
        crate::final_event::append_final(conn, &params.id, &body, params.now_ms).await?;
    }
    Ok(changed == 1)
}

impl PgStore {
    /// R3: claims up to `limit` of the oldest due queued runs (of the claim's agents), the
    /// oldest first, in one statement. The ids are picked once, as an array (a subquery
    /// under `IN` could be run again for each row); SKIP LOCKED passes over rows another claimant
    /// holds; the outer guard re-checks "queued and due" on each row as locked. Each claim
    /// epoch goes up by one; the last requeue's reason is cleared: the run is running
    /// again. It runs in a transaction whose commit is awaited: the returned rows are
    /// acted on only once the claim is known to be stored (a commit whose answer is lost
    /// is an error, and the runs' leases then run out for the reaper), and they are all
    /// claimed or none. BEGIN, the statement and COMMIT go in one flight.
    async fn claim_up_to(
        &self,
        operation: &'static str,
        params: Claim,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut runs = self
            .with(operation, async {
                let client = self.client().await?;
                let stmt = client
                    .prepare_cached(&format!(
                        "UPDATE runs SET status = 'running', claimed_by = $1, lease_expires_ms = $2,
                             termination_reason = NULL, updated_ms = $3,
                             claim_epoch = claim_epoch + 1
                         WHERE id = ANY(ARRAY(
                             SELECT id FROM runs WHERE status = 'queued' AND retry_at_ms <= $3
                               AND ($4::TEXT[] IS NULL OR agent = ANY($4::TEXT[]))
                             ORDER BY created_ms, id
                             LIMIT $5
                             FOR UPDATE SKIP LOCKED
                         )) AND status = 'queued' AND retry_at_ms <= $3
                         RETURNING {RUN_COLUMNS}"
                    ))
                    .await?;
                // Prepared before the flights: inside one, COMMIT could leave before it.
                let start = client.prepare_cached(START).await?;
                let claim = async {
                    let rows = client
                        .query(
                            &stmt,
                            &[
                                &params.owner,
                                &params.lease_until_ms,
                                &params.now_ms,
                                &params.agents,
                                &limit,
                            ],
                        )
                        .await?;
                    rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()
                };
                if !params.start {
                    let runs = begin_with(&client, commit_with(&client, claim)).await?;
                    return Ok(runs.into_iter().map(|run| (run, None)).collect());
                }
                // Two flights: BEGIN and the claim, then the starts and COMMIT.
                let runs = begin_with(&client, claim).await?;
                if runs.is_empty() {
                    rollback(&client).await; // nothing was changed
                    return Ok(Vec::new());
                }
                commit_with(&client, record_starts(&client, &start, &params, runs)).await
            })
            .await?;
        // RETURNING keeps no order: the oldest first, as they were picked.
        runs.sort_by(|(a, _), (b, _)| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(runs)
    }
}

/// A claimed run, and the `run_started` event the claim recorded for it.
type ClaimedRun = (Run, Option<RunEvent>);

/// The `run_started` rows of a claim, for the runs with no events yet.
const START: &str = "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
     SELECT s.run_id, 1, $4::TEXT, s.payload, $3
     FROM unnest($1::TEXT[], $2::TEXT[]) AS s (run_id, payload)
     WHERE NOT EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = s.run_id)
     RETURNING run_id";

/// Records `run_started` for each claimed run that has no events, in the claim's
/// transaction (the claim holds the rows, so no one appends meanwhile); the runs with the
/// start each got.
async fn record_starts(
    client: &Conn,
    start: &tokio_postgres::Statement,
    params: &Claim,
    runs: Vec<Run>,
) -> Result<Vec<ClaimedRun>, Failure> {
    let mut starts = std::collections::HashMap::new();
    for run in &runs {
        if let Some(body) = RunStarted::at_claim(run, &params.owner) {
            starts.insert(run.id.clone(), body);
        }
    }
    let ids: Vec<&String> = starts.keys().collect();
    let payloads: Vec<String> = ids
        .iter()
        .map(|id| starts[*id].to_payload().to_string())
        .collect();
    let mut started = std::collections::HashSet::new();
    // Every start is a `run_started`, so the kind is one parameter.
    if let Some(kind) = starts.values().next().map(|b| b.kind()) {
        for row in client
            .query(start, &[&ids, &payloads, &params.now_ms, &kind])
            .await?
        {
            started.insert(row.try_get::<_, String>(0)?);
        }
    }
    Ok(runs
        .into_iter()
        .map(|run| {
            let body = starts.remove(&run.id).filter(|_| started.contains(&run.id));
            let event = body.map(|body| RunEvent {
                run_id: run.id.clone(),
                seq: 1,
                kind: body.kind().to_string(),
                payload: body.to_payload(),
                time_ms: params.now_ms,
            });
            (run, event)
        })
        .collect())
}
