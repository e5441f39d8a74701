//! `RunStore` for PostgreSQL: run rows and their events (R1), the lease (R3), the
//! cancel (R4), the status reads (R5, R6) and the write fence (R7).
//!
//! Every write that could race is one guarded UPDATE whose affected-row count (or
//! `RETURNING`) decides. Where an answer needs the row's state as well (a cancel's
//! `previous`, a refused settle), the row is locked with `SELECT ... FOR UPDATE` in the
//! same transaction, so another node cannot change it between the read and the update.
//! Changes are announced by the triggers of migration 0007 at commit, never from here.

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::decision::{
    AnswerOutcome, Decision, DecisionAnswer, DecisionAsk, DecisionFilter,
};
use runwarden_runtime::rules::rows::{self, StoredRun};
use runwarden_runtime::rules::runs::{self as rules, CANCEL_REASON, CancelStep};
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, Run, RunCreate, RunEvent, RunFilter,
    RunSettle, RunStore, SettleAnswer,
};
use runwarden_runtime::{ChangeFeed, KeyedCreate, RunCreateKeyed, RunState};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row};

use crate::PgStore;
use crate::failure::{Failure, finish};
use crate::run_counts;

pub(crate) const RUN_COLUMNS: &str = "id, agent, status, termination_reason, request, claimed_by, lease_expires_ms, \
                           pending_effect, requeue_count, rounds, correlation, created_ms, updated_ms, claim_epoch, \
                           started_by, tags";

const READING_STATUS: &str = "reading a run's status";
const SETTLING: &str = "settling a run";

#[async_trait]
impl RunStore for PgStore {
    async fn run_create(&self, params: RunCreate) -> Result<Run, StoreError> {
        self.with("creating a run", async {
            let client = self.client().await?;
            insert_run(client.plain(), &params).await
        })
        .await
    }

    async fn run_create_keyed(&self, params: RunCreateKeyed) -> Result<KeyedCreate, StoreError> {
        self.create_keyed(params).await
    }

    async fn run_get(&self, id: &str) -> Result<Option<Run>, StoreError> {
        self.with("reading a run", async {
            let client = self.client().await?;
            read_run(client.plain(), id, false).await
        })
        .await
    }

    async fn run_statuses(&self, ids: &[String]) -> Result<Vec<(String, RunState)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // R6 (amended): one query for every run the watcher follows, however many calls
        // are in flight: the whole list is one array parameter.
        self.with(READING_STATUS, async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("SELECT id, status FROM runs WHERE id = ANY($1)")
                .await?;
            let rows = client.query(&stmt, &[&ids]).await?;
            rows.iter()
                .map(|row| {
                    let id: String = row.try_get(0)?;
                    let status = parse_status(&id, row.try_get(1)?)?;
                    Ok((id, status))
                })
                .collect()
        })
        .await
    }

    fn change_feed(&self) -> &ChangeFeed {
        self.feed()
    }

    async fn run_cancel(&self, id: &str, now_ms: i64) -> Result<CancelAnswer, StoreError> {
        const OPERATION: &str = "cancelling a run";
        self.with(OPERATION, async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = async {
                // R4: the row is locked before it is read, so `previous` is the state the
                // cancel really left, whatever another node is doing to the run.
                let status = read_status(&*tx, id, true).await?;
                let (previous, final_event) = match rules::cancel_step(status) {
                    CancelStep::Answer(answer) => return Ok(answer),
                    CancelStep::Cancel {
                        previous,
                        final_event,
                    } => (previous, final_event),
                };
                // R4: the stored request goes (nothing may resume the run); pending_effect and
                // claimed_by stay, so the reaper and people can see a cancelled mid-write run (R7).
                let changed = tx
                    .execute(
                        "UPDATE runs SET status = 'cancelled', request = NULL, termination_reason = $1,
                             updated_ms = $2
                         WHERE id = $3 AND status NOT IN ('completed', 'failed', 'cancelled')",
                        &[&CANCEL_REASON, &now_ms, &id],
                    )
                    .await?;
                if changed != 1 {
                    return Err(rules::cancel_raced(id).into());
                }
                // R12: the cancel wins over a decision the run waits on.
                crate::decision_store::drop_pending(&*tx, id, now_ms).await?;
                // R8: no segment holds a queued or parked run, so its final event is
                // written here, with the status change.
                if let Some(body) = final_event {
                    crate::final_event::append_final(&*tx, id, &body, now_ms).await?;
                }
                Ok(CancelAnswer::Cancelled { previous })
            }
            .await;
            finish(tx, result).await
        })
        .await
    }

    async fn run_heartbeat(&self, params: Heartbeat) -> Result<bool, StoreError> {
        self.with("renewing a run's lease", async {
            let client = self.client().await?;
            // R3: a renewal that matches no row means the lease was lost. A cancelled run
            // still belongs to its segment until the segment records its boundary step (R5).
            let stmt = client
                .prepare_cached(
                    "UPDATE runs SET lease_expires_ms = $1, updated_ms = $2
                     WHERE id = $3 AND claimed_by = $4 AND claim_epoch = $5
                       AND status IN ('running', 'cancelled')",
                )
                .await?;
            let changed = client
                .execute(
                    &stmt,
                    &[
                        &params.lease_until_ms,
                        &params.now_ms,
                        &params.id,
                        &params.owner,
                        &params.epoch,
                    ],
                )
                .await?;
            Ok(changed == 1)
        })
        .await
    }

    async fn run_fence_mark(&self, params: FenceMark) -> Result<bool, StoreError> {
        const OPERATION: &str = "marking a run's write fence";
        let result = self
            .with(OPERATION, async {
                let client = self.client().await?;
                // R7: no lease of this claim or no running run, no write. An autocommit
                // statement: `execute` answers after the server confirmed its commit.
                let stmt = client
                .prepare_cached(
                    "UPDATE runs SET pending_effect = $1, lease_expires_ms = $2, updated_ms = $3
                     WHERE id = $4 AND claimed_by = $5 AND claim_epoch = $6 AND status = 'running'",
                )
                .await?;
                let changed = client
                    .execute(
                        &stmt,
                        &[
                            &params.effect,
                            &params.lease_until_ms,
                            &params.now_ms,
                            &params.id,
                            &params.owner,
                            &params.epoch,
                        ],
                    )
                    .await?;
                Ok(changed == 1)
            })
            .await;
        // A mark whose answer was lost may be stored: then the fence is in place and the
        // write may go; read as "not stamped", the run would end FENCED_WRITE with
        // nothing sent. A later renewal only moves the lease further out.
        self.confirm(result, OPERATION, || async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT 1 FROM runs WHERE id = $1 AND claimed_by = $2 AND claim_epoch = $3
                         AND status = 'running' AND pending_effect = $4 AND lease_expires_ms >= $5",
                    &[
                        &params.id,
                        &params.owner,
                        &params.epoch,
                        &params.effect,
                        &params.lease_until_ms,
                    ],
                )
                .await?;
            Ok(row.map(|_| true))
        })
        .await
    }

    async fn run_event_append(&self, params: EventAppend) -> Result<Option<i64>, StoreError> {
        rules::check_event_append(&params)?;
        self.append_event(params).await
    }

    async fn run_settle(&self, params: RunSettle) -> Result<SettleAnswer, StoreError> {
        rules::check_settle_status(params.status)?;
        let result = self
            .with(SETTLING, async {
                let mut client = self.client().await?;
                let tx = client.transaction().await?;
                let result = async {
                    let changed = tx
                        .execute(
                            "UPDATE runs SET status = $1, termination_reason = $2, updated_ms = $3
                         WHERE id = $4 AND claimed_by = $5 AND claim_epoch = $6
                           AND status = 'running'",
                            &[
                                &params.status.as_str(),
                                &params.reason,
                                &params.now_ms,
                                &params.id,
                                &params.owner,
                                &params.epoch,
                            ],
                        )
                        .await?;
                    let answer = if changed == 1 {
                        SettleAnswer::Settled
                    } else {
                        // A cancel that won the row is never overwritten; otherwise the
                        // lease is lost.
                        rules::lost_row(read_status(&*tx, &params.id, false).await?).into()
                    };
                    Ok(answer)
                }
                .await;
                finish(tx, result).await
            })
            .await;
        // A settle whose answer was lost may be stored: the row then says so.
        self.confirm(result, SETTLING, || async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT 1 FROM runs WHERE id = $1 AND claimed_by = $2 AND claim_epoch = $3
                         AND status = $4 AND termination_reason = $5",
                    &[
                        &params.id,
                        &params.owner,
                        &params.epoch,
                        &params.status.as_str(),
                        &params.reason,
                    ],
                )
                .await?;
            Ok(row.map(|_| SettleAnswer::Settled))
        })
        .await
    }

    async fn run_list(&self, filter: RunFilter) -> Result<Vec<Run>, StoreError> {
        self.with("listing runs", async {
            let client = self.client().await?;
            let limit = runwarden_runtime::store::page_limit(filter.limit);
            // Only the filters asked for are in the text, so the planner sees each one and
            // walks `runs_status_id` or `runs_agent_id` from the newest end.
            let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE TRUE");
            let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
            let status = filter.status.map(RunState::as_str);
            if let Some(status) = &status {
                args.push(status);
                sql.push_str(&format!(" AND status = ${}", args.len()));
            }
            if let Some(agent) = &filter.agent {
                args.push(agent);
                sql.push_str(&format!(" AND agent = ${}", args.len()));
            }
            if let Some(before) = &filter.before_id {
                args.push(before);
                sql.push_str(&format!(" AND id < ${}", args.len()));
            }
            args.push(&limit);
            sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &args).await?;
            rows.iter().map(run_row).collect()
        })
        .await
    }

    async fn run_counts(&self) -> Result<Vec<(RunState, u64)>, StoreError> {
        self.with("counting runs", async {
            let mut client = self.client().await?;
            // A fold that fails leaves its changes to the read, which adds them: the
            // scrape still answers, with every run counted.
            if let Err(error) = run_counts::fold(&mut client).await {
                tracing::debug!(%error, "run counts not folded; the read adds the changes");
            }
            run_counts::read(&client)
                .await?
                .into_iter()
                .map(|(status, n)| Ok((parse_status("(count)", &status)?, n)))
                .collect()
        })
        .await
    }

    async fn run_events(
        &self,
        id: &str,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<RunEvent>, StoreError> {
        self.with("listing a run's events", async {
            let client = self.client().await?;
            // A NULL limit is no limit.
            let limit = (limit > 0).then_some(i64::from(limit));
            let stmt = client
                .prepare_cached(
                    "SELECT run_id, seq, kind, payload, time_ms FROM run_events
                     WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                )
                .await?;
            let rows = client.query(&stmt, &[&id, &after_seq, &limit]).await?;
            rows.iter()
                .map(|row| {
                    let run_id: String = row.try_get(0)?;
                    let seq: i64 = row.try_get(1)?;
                    let payload = serde_json::from_str(row.try_get(3)?).map_err(|e| {
                        Failure::Corrupt(format!(
                            "event {seq} of run {run_id} has a payload that is not JSON ({e})"
                        ))
                    })?;
                    Ok(RunEvent {
                        run_id,
                        seq,
                        kind: row.try_get(2)?,
                        payload,
                        time_ms: row.try_get(4)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn decision_ask(&self, params: DecisionAsk) -> Result<Option<i64>, StoreError> {
        self.ask(params).await
    }

    async fn decision_answer(&self, params: DecisionAnswer) -> Result<AnswerOutcome, StoreError> {
        self.answer(params).await
    }

    async fn decision_get(&self, id: &str) -> Result<Option<Decision>, StoreError> {
        self.decision(id).await
    }

    async fn decision_list(&self, filter: DecisionFilter) -> Result<Vec<Decision>, StoreError> {
        self.decisions(filter).await
    }
}

/// The status of run `id`; with `lock`, the row stays locked until the caller's
/// transaction ends. `None` when there is no run.
async fn read_status(
    conn: &impl GenericClient,
    id: &str,
    lock: bool,
) -> Result<Option<RunState>, Failure> {
    let sql = if lock {
        "SELECT status FROM runs WHERE id = $1 FOR UPDATE"
    } else {
        "SELECT status FROM runs WHERE id = $1"
    };
    let row = conn.query_opt(sql, &[&id]).await?;
    row.map(|row| parse_status(id, row.try_get(0)?)).transpose()
}

/// Inserts a new run (R1, R3), inside the caller's transaction when there is one.
pub(crate) async fn insert_run(
    conn: &impl GenericClient,
    params: &RunCreate,
) -> Result<Run, Failure> {
    let request = params.request.as_ref().map(serde_json::Value::to_string);
    let tags = serde_json::Value::from(params.origin.tags.clone()).to_string();
    let run = rules::new_run(params.clone());
    let inserted = conn
        .execute(
            "INSERT INTO runs (id, agent, status, request, claimed_by, lease_expires_ms,
                               correlation, created_ms, updated_ms, claim_epoch, started_by, tags)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10, $11)
             ON CONFLICT (id) DO NOTHING",
            &[
                &run.id,
                &run.agent,
                &run.status.as_str(),
                &request,
                &run.claimed_by,
                &run.lease_expires_ms,
                &run.correlation,
                &run.created_ms,
                &run.claim_epoch,
                &run.origin.started_by,
                &tags,
            ],
        )
        .await?;
    if inserted == 0 {
        return Err(rules::duplicate_run(&run.id).into());
    }
    Ok(run)
}

/// Run `id`; with `lock`, the row stays locked until the caller's transaction ends.
pub(crate) async fn read_run(
    conn: &impl GenericClient,
    id: &str,
    lock: bool,
) -> Result<Option<Run>, Failure> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let row = conn.query_opt(&sql, &[&id]).await?;
    row.as_ref().map(run_row).transpose()
}

/// A stored status this build does not know is damage, reported, never a panic.
fn parse_status(id: &str, text: &str) -> Result<RunState, Failure> {
    rows::run_status(id, text).map_err(Failure::Corrupt)
}

/// A run row, its status, request and counters checked.
pub(crate) fn run_row(row: &Row) -> Result<Run, Failure> {
    let stored = StoredRun {
        id: row.try_get(0)?,
        agent: row.try_get(1)?,
        status: row.try_get(2)?,
        termination_reason: row.try_get(3)?,
        request: row.try_get(4)?,
        claimed_by: row.try_get(5)?,
        lease_expires_ms: row.try_get(6)?,
        pending_effect: row.try_get(7)?,
        requeue_count: row.try_get(8)?,
        rounds: row.try_get(9)?,
        correlation: row.try_get(10)?,
        created_ms: row.try_get(11)?,
        updated_ms: row.try_get(12)?,
        claim_epoch: row.try_get(13)?,
        started_by: row.try_get(14)?,
        tags: row.try_get(15)?,
    };
    rows::run(stored).map_err(Failure::Corrupt)
}
