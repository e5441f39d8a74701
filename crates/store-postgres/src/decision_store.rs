//! Operator decisions for PostgreSQL (R12): asking one parks the run in the same
//! transaction; answering is one guarded UPDATE that also appends `decision_answered` and
//! moves the run back to the queue (or cancels it), so two answers racing, on any nodes,
//! leave one.
//!
//! Every write locks the run's row first (the ask through its guarded UPDATE, the answer
//! with `SELECT ... FOR UPDATE`), as the cancel and the event append do, so the three take
//! turns per run and always lock in the same order. Changes reach other nodes through
//! 0007's triggers on the run's status and on the appended event.

use runwarden_base::StoreError;
use runwarden_runtime::RunState;
use runwarden_runtime::decision::{
    AnswerOutcome, AnswerRefusal, Decision, DecisionAnswer, DecisionAsk, DecisionFilter,
    DecisionStatus,
};
use runwarden_runtime::events::{DecisionAnswered, EventBody};
use runwarden_runtime::rules::decisions::{self as rules, CANCEL_BY_ANSWER_REASON, RunAfterAnswer};
use runwarden_runtime::rules::rows::{self, StoredDecision};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row};

use crate::PgStore;
use crate::failure::{Failure, finish};

const DECISION_COLUMNS: &str = "id, run_id, kind, round, call_id, tool, arguments, arguments_hash, message, \
     requested_schema, asked_ms, expires_ms, status, answer, reason, answer_arguments, content, \
     actor, answered_ms, input_key, request_state, in_call";

impl PgStore {
    pub(crate) async fn ask(&self, params: DecisionAsk) -> Result<Option<i64>, StoreError> {
        self.with("asking a decision", async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = ask(&*tx, &params).await;
            finish(tx, result).await
        })
        .await
    }

    pub(crate) async fn answer(&self, params: DecisionAnswer) -> Result<AnswerOutcome, StoreError> {
        self.with("answering a decision", async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = answer(&*tx, &params).await;
            finish(tx, result).await
        })
        .await
    }

    pub(crate) async fn decision(&self, id: &str) -> Result<Option<Decision>, StoreError> {
        self.with("reading a decision", async {
            let client = self.client().await?;
            read(client.plain(), id, false).await
        })
        .await
    }

    pub(crate) async fn decisions(
        &self,
        filter: DecisionFilter,
    ) -> Result<Vec<Decision>, StoreError> {
        self.with("listing decisions", async {
            let client = self.client().await?;
            let limit = runwarden_runtime::store::page_limit(filter.limit);
            // Only the filters asked for are in the text, so the planner sees each one and
            // reads an index.
            let mut sql = format!("SELECT {DECISION_COLUMNS} FROM decisions WHERE TRUE");
            let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
            let status = filter.status.map(DecisionStatus::as_str);
            if let Some(status) = &status {
                args.push(status);
                sql.push_str(&format!(" AND status = ${}", args.len()));
            }
            if let Some(run_id) = &filter.run_id {
                args.push(run_id);
                sql.push_str(&format!(" AND run_id = ${}", args.len()));
            }
            if let Some(due_by_ms) = &filter.due_by_ms {
                args.push(due_by_ms);
                sql.push_str(&format!(
                    " AND status = 'pending' AND expires_ms <= ${}",
                    args.len()
                ));
            }
            args.push(&limit);
            sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &args).await?;
            rows.iter().map(decode).collect()
        })
        .await
    }
}

/// R12: the guarded ask. The run must be running and held by `owner`.
async fn ask(tx: &impl GenericClient, params: &DecisionAsk) -> Result<Option<i64>, Failure> {
    let d = &params.decision;
    // The kinds that park release the lease and leave the stored request; whether the
    // park clears the write fence is the runtime's rule.
    let changed = if d.parks_the_run() {
        tx.execute(
            "UPDATE runs SET status = 'waiting_for_approval', lease_expires_ms = NULL,
                 pending_effect = CASE WHEN $4 THEN NULL ELSE pending_effect END, updated_ms = $1
             WHERE id = $2 AND claimed_by = $3 AND claim_epoch = $5 AND status = 'running'",
            &[
                &d.asked_ms,
                &d.run_id,
                &params.owner,
                &rules::ask_clears_fence(d),
                &params.epoch,
            ],
        )
        .await?
    } else {
        tx.execute(
            "UPDATE runs SET updated_ms = $1
             WHERE id = $2 AND claimed_by = $3 AND claim_epoch = $4 AND status = 'running'",
            &[&d.asked_ms, &d.run_id, &params.owner, &params.epoch],
        )
        .await?
    };
    if changed != 1 {
        return Ok(None);
    }
    let seq = append(
        tx,
        &d.run_id,
        "decision_asked",
        &params.event_payload,
        d.asked_ms,
    )
    .await?;
    tx.execute(
        &format!(
            "INSERT INTO decisions ({DECISION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'pending', NULL, NULL, NULL, NULL, NULL, NULL, $13, $14, $15)"
        ),
        &[
            &d.id,
            &d.run_id,
            &d.kind.as_str(),
            &i64::from(d.round),
            &d.call_id,
            &d.tool,
            &d.arguments.to_string(),
            &d.arguments_hash,
            &d.message,
            &d.requested_schema.as_ref().map(Value::to_string),
            &d.asked_ms,
            &d.expires_ms,
            &d.reissue.as_ref().map(|r| r.input_key.clone()),
            &d.reissue.as_ref().and_then(|r| r.request_state.clone()),
            &d.in_call,
        ],
    )
    .await?;
    Ok(Some(seq))
}

/// R12: the guarded answer, with the run's move and the event in the same transaction.
async fn answer(
    tx: &impl GenericClient,
    params: &DecisionAnswer,
) -> Result<AnswerOutcome, Failure> {
    // The run's row first: a cancel or an appender of the same run waits for us, and we
    // for them; the decision is read after the lock is held, so it is current.
    let run_status: Option<String> = tx
        .query_opt(
            "SELECT r.status FROM runs r JOIN decisions d ON d.run_id = r.id
             WHERE d.id = $1 FOR UPDATE OF r",
            &[&params.id],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    let Some(before) = read(tx, &params.id, true).await? else {
        return Ok(AnswerOutcome::NotFound);
    };
    let run = run_status.as_deref().and_then(RunState::parse);
    if let Some(refusal) = rules::answer_refusal(&before, run, params.answer, params.now_ms) {
        return Ok(AnswerOutcome::Refused(before, refusal));
    }
    let (status_after, reason) = rules::recorded(params.answer, params.reason.as_deref());
    let changed = tx
        .execute(
            "UPDATE decisions SET status = $1, answer = $2, reason = $3, answer_arguments = $4,
                 content = $5, actor = $6, answered_ms = $7
             WHERE id = $8 AND status = 'pending'",
            &[
                &status_after.as_str(),
                &params.answer.as_str(),
                &reason,
                &params.arguments.as_ref().map(Value::to_string),
                &params.content.as_ref().map(Value::to_string),
                &params.actor,
                &params.now_ms,
                &params.id,
            ],
        )
        .await?;
    if changed != 1 {
        return Ok(AnswerOutcome::Refused(
            before,
            AnswerRefusal::AlreadyAnswered,
        ));
    }
    let Some(decision) = read(tx, &params.id, false).await? else {
        return Err(Failure::Corrupt(format!(
            "decision {} vanished inside its answer's transaction",
            params.id
        )));
    };
    let Some(event) = DecisionAnswered::of(&decision) else {
        return Err(Failure::Corrupt(format!(
            "decision {} has no answer after its answer",
            params.id
        )));
    };
    let body = EventBody::DecisionAnswered(event);
    append(
        tx,
        &decision.run_id,
        body.kind(),
        &body.to_payload(),
        params.now_ms,
    )
    .await?;
    match rules::run_after_answer(&decision, params.answer) {
        RunAfterAnswer::Stays => {}
        RunAfterAnswer::Cancelled { final_event } => {
            // A cancel by answer is the cancel: terminal, the stored request dropped.
            tx.execute(
                "UPDATE runs SET status = 'cancelled', request = NULL, termination_reason = $1,
                     updated_ms = $2
                 WHERE id = $3 AND status = 'waiting_for_approval'",
                &[&CANCEL_BY_ANSWER_REASON, &params.now_ms, &decision.run_id],
            )
            .await?;
            // The parked run's final event, with the cancel (no segment holds it).
            if let Some(body) = final_event {
                crate::final_event::append_final(tx, &decision.run_id, &body, params.now_ms)
                    .await?;
            }
        }
        RunAfterAnswer::Requeued { clear_fence } => {
            tx.execute(
                "UPDATE runs SET status = 'queued', retry_at_ms = $1, lease_expires_ms = NULL,
                     pending_effect = CASE WHEN $2 THEN NULL ELSE pending_effect END,
                     updated_ms = $1
                 WHERE id = $3 AND status = 'waiting_for_approval'",
                &[&params.now_ms, &clear_fence, &decision.run_id],
            )
            .await?;
        }
    }
    Ok(AnswerOutcome::Answered(decision))
}

/// Appends an event with the next sequence; the caller holds the run's row lock.
async fn append(
    tx: &impl GenericClient,
    run_id: &str,
    kind: &str,
    payload: &Value,
    now_ms: i64,
) -> Result<i64, Failure> {
    let row = tx
        .query_one(
            "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
             SELECT $1::TEXT, COALESCE(MAX(seq), 0) + 1, $2::TEXT, $3::TEXT, $4::BIGINT
             FROM run_events WHERE run_id = $1::TEXT
             RETURNING seq",
            &[&run_id, &kind, &payload.to_string(), &now_ms],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// R4, R12: a cancel drops the run's pending decisions, inside the cancel's transaction.
pub(crate) async fn drop_pending(
    tx: &impl GenericClient,
    run_id: &str,
    now_ms: i64,
) -> Result<(), Failure> {
    tx.execute(
        "UPDATE decisions SET status = 'dropped', answered_ms = $1
         WHERE run_id = $2 AND status = 'pending'",
        &[&now_ms, &run_id],
    )
    .await?;
    Ok(())
}

async fn read(
    conn: &impl GenericClient,
    id: &str,
    lock: bool,
) -> Result<Option<Decision>, Failure> {
    let sql = format!(
        "SELECT {DECISION_COLUMNS} FROM decisions WHERE id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let row = conn.query_opt(&sql, &[&id]).await?;
    row.as_ref().map(decode).transpose()
}

/// Stored text this build cannot read is damage, reported, never a panic.
fn decode(row: &Row) -> Result<Decision, Failure> {
    let stored = StoredDecision {
        id: row.try_get(0)?,
        run_id: row.try_get(1)?,
        kind: row.try_get(2)?,
        round: row.try_get(3)?,
        call_id: row.try_get(4)?,
        tool: row.try_get(5)?,
        arguments: row.try_get(6)?,
        arguments_hash: row.try_get(7)?,
        message: row.try_get(8)?,
        requested_schema: row.try_get(9)?,
        asked_ms: row.try_get(10)?,
        expires_ms: row.try_get(11)?,
        status: row.try_get(12)?,
        answer: row.try_get(13)?,
        reason: row.try_get(14)?,
        answer_arguments: row.try_get(15)?,
        content: row.try_get(16)?,
        actor: row.try_get(17)?,
        answered_ms: row.try_get(18)?,
        input_key: row.try_get(19)?,
        request_state: row.try_get(20)?,
        in_call: row.try_get(21)?,
    };
    rows::decision(stored).map_err(Failure::Corrupt)
}
