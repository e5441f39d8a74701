//! Operator decisions for SQLite (R12): asking one parks the run in the same
//! transaction; answering is one guarded UPDATE that also appends `decision_answered` and
//! moves the run back to the queue (or cancels it), so two answers racing leave one.
//!
//! Each write runs in one `BEGIN IMMEDIATE` transaction, so another process cannot change
//! the decision or the run between the guard and the rest.

use runwarden_base::StoreError;
use runwarden_runtime::decision::{
    AnswerOutcome, AnswerRefusal, Decision, DecisionAnswer, DecisionAsk, DecisionFilter,
    DecisionStatus,
};
use runwarden_runtime::events::{DecisionAnswered, EventBody};
use runwarden_runtime::rules::decisions::{self as rules, CANCEL_BY_ANSWER_REASON, RunAfterAnswer};
use runwarden_runtime::rules::rows::{self, StoredDecision};
use runwarden_runtime::{Change, RunState};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::Value;

use crate::SqliteStore;
use crate::cached::Cached;
use crate::failure::Failure;
use crate::publish::publish_status;

const DECISION_COLUMNS: &str = "id, run_id, kind, round, call_id, tool, arguments, arguments_hash, message, \
     requested_schema, asked_ms, expires_ms, status, answer, reason, answer_arguments, content, \
     actor, answered_ms, input_key, request_state, in_call";

impl SqliteStore {
    pub(crate) async fn ask(&self, params: DecisionAsk) -> Result<Option<i64>, StoreError> {
        let run_id = params.decision.run_id.clone();
        let parks = params.decision.parks_the_run();
        let seq = self
            .run("asking a decision", move |conn| ask(conn, &params))
            .await?;
        if let Some(seq) = seq {
            self.feed().publish(Change::Appended {
                run_id: run_id.clone(),
                seq,
            });
            if parks {
                publish_status(self.feed(), &run_id, RunState::WaitingForApproval);
            }
        }
        Ok(seq)
    }

    pub(crate) async fn answer(&self, params: DecisionAnswer) -> Result<AnswerOutcome, StoreError> {
        let (outcome, seq, status) = self
            .run("answering a decision", move |conn| answer(conn, &params))
            .await?;
        if let AnswerOutcome::Answered(decision) = &outcome {
            if let Some(seq) = seq {
                self.feed().publish(Change::Appended {
                    run_id: decision.run_id.clone(),
                    seq,
                });
            }
            if let Some(status) = status {
                publish_status(self.feed(), &decision.run_id, status);
            }
        }
        Ok(outcome)
    }

    pub(crate) async fn decision(&self, id: &str) -> Result<Option<Decision>, StoreError> {
        let id = id.to_owned();
        self.run("reading a decision", move |conn| read(conn, &id))
            .await
    }

    pub(crate) async fn decisions(
        &self,
        filter: DecisionFilter,
    ) -> Result<Vec<Decision>, StoreError> {
        self.run("listing decisions", move |conn| {
            let limit = runwarden_runtime::store::page_limit(filter.limit);
            let mut stmt = conn.prepare_cached(&list_sql(&filter))?;
            let status = filter.status.map(DecisionStatus::as_str);
            let rows = stmt
                .query_map(
                    params![status, filter.run_id, filter.due_by_ms, limit],
                    columns,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(decode).collect()
        })
        .await
    }
}

/// The list of decisions for `filter`'s shape: only the filters asked for are in the text,
/// so the planner sees each one and reads an index (`?1 IS NULL OR status = ?1` hid them,
/// and the pending decisions were found by reading every decision). The parameters keep
/// their numbers: state, run, due by, limit.
pub(crate) fn list_sql(filter: &DecisionFilter) -> String {
    let mut sql = format!("SELECT {DECISION_COLUMNS} FROM decisions WHERE 1 = 1");
    if filter.status.is_some() {
        sql.push_str(" AND status = ?1");
    }
    if filter.run_id.is_some() {
        sql.push_str(" AND run_id = ?2");
    }
    if filter.due_by_ms.is_some() {
        sql.push_str(" AND status = 'pending' AND expires_ms <= ?3");
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?4");
    sql
}

/// R12: the guarded ask. The run must be running and held by `owner` under the claim's
/// epoch.
fn ask(conn: &mut Connection, params: &DecisionAsk) -> Result<Option<i64>, Failure> {
    let d = &params.decision;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // The kinds that park release the lease and leave the stored request: the run holds
    // no slot and any worker may resume it once it is answered. Whether the park clears
    // the write fence is the runtime's rule.
    let changed = if d.parks_the_run() {
        tx.execute_cached(
            "UPDATE runs SET status = 'waiting_for_approval', lease_expires_ms = NULL,
                 pending_effect = CASE WHEN ?4 THEN NULL ELSE pending_effect END,
                 updated_ms = ?1
             WHERE id = ?2 AND claimed_by = ?3 AND claim_epoch = ?5 AND status = 'running'",
            params![
                d.asked_ms,
                d.run_id,
                params.owner,
                rules::ask_clears_fence(d),
                params.epoch
            ],
        )?
    } else {
        tx.execute_cached(
            "UPDATE runs SET updated_ms = ?1
             WHERE id = ?2 AND claimed_by = ?3 AND claim_epoch = ?4 AND status = 'running'",
            params![d.asked_ms, d.run_id, params.owner, params.epoch],
        )?
    };
    if changed != 1 {
        return Ok(None); // dropping the transaction rolls it back
    }
    let seq = append(
        &tx,
        &d.run_id,
        "decision_asked",
        &params.event_payload,
        d.asked_ms,
    )?;
    tx.execute(
        &format!("INSERT INTO decisions ({DECISION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 'pending', NULL, NULL, NULL, NULL, NULL, NULL, ?13, ?14, ?15)"),
        params![
            d.id,
            d.run_id,
            d.kind.as_str(),
            i64::from(d.round),
            d.call_id,
            d.tool,
            d.arguments.to_string(),
            d.arguments_hash,
            d.message,
            d.requested_schema.as_ref().map(Value::to_string),
            d.asked_ms,
            d.expires_ms,
            d.reissue.as_ref().map(|r| r.input_key.clone()),
            d.reissue.as_ref().and_then(|r| r.request_state.clone()),
            d.in_call,
        ],
    )?;
    tx.commit()?;
    Ok(Some(seq))
}

type Answered = (AnswerOutcome, Option<i64>, Option<RunState>);

/// R12: the guarded answer, with the run's move and the event in the same transaction.
fn answer(conn: &mut Connection, params: &DecisionAnswer) -> Result<Answered, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(before) = read(&tx, &params.id)? else {
        return Ok((AnswerOutcome::NotFound, None, None));
    };
    // Under the write lock nothing changes between these reads and the update.
    let run = read_run_status(&tx, &before.run_id)?;
    if let Some(refusal) = rules::answer_refusal(&before, run, params.answer, params.now_ms) {
        return Ok((AnswerOutcome::Refused(before, refusal), None, None));
    }
    let (status_after, reason) = rules::recorded(params.answer, params.reason.as_deref());
    let changed = tx.execute_cached(
        "UPDATE decisions SET status = ?1, answer = ?2, reason = ?3, answer_arguments = ?4,
             content = ?5, actor = ?6, answered_ms = ?7
         WHERE id = ?8 AND status = 'pending'",
        params![
            status_after.as_str(),
            params.answer.as_str(),
            reason,
            params.arguments.as_ref().map(Value::to_string),
            params.content.as_ref().map(Value::to_string),
            params.actor,
            params.now_ms,
            params.id,
        ],
    )?;
    if changed != 1 {
        return Ok((
            AnswerOutcome::Refused(before, AnswerRefusal::AlreadyAnswered),
            None,
            None,
        ));
    }
    let Some(decision) = read(&tx, &params.id)? else {
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
    let seq = append(
        &tx,
        &decision.run_id,
        body.kind(),
        &body.to_payload(),
        params.now_ms,
    )?;
    let after = rules::run_after_answer(&decision, params.answer);
    let mut final_seq = None;
    match &after {
        RunAfterAnswer::Stays => {}
        RunAfterAnswer::Cancelled { final_event } => {
            // A cancel by answer is the cancel: terminal, the stored request dropped.
            tx.execute_cached(
                "UPDATE runs SET status = 'cancelled', request = NULL, termination_reason = ?1,
                     updated_ms = ?2
                 WHERE id = ?3 AND status = 'waiting_for_approval'",
                params![CANCEL_BY_ANSWER_REASON, params.now_ms, decision.run_id],
            )?;
            // The parked run's final event, with the cancel (no segment holds it).
            if let Some(body) = final_event {
                final_seq =
                    crate::final_event::append_final(&tx, &decision.run_id, body, params.now_ms)?;
            }
        }
        RunAfterAnswer::Requeued { clear_fence } => {
            tx.execute_cached(
                "UPDATE runs SET status = 'queued', retry_at_ms = ?1, lease_expires_ms = NULL,
                     pending_effect = CASE WHEN ?2 THEN NULL ELSE pending_effect END,
                     updated_ms = ?1
                 WHERE id = ?3 AND status = 'waiting_for_approval'",
                params![params.now_ms, clear_fence, decision.run_id],
            )?;
        }
    }
    tx.commit()?;
    // The feed names the last event appended; readers re-read from their own cursor.
    let seq = final_seq.unwrap_or(seq);
    Ok((AnswerOutcome::Answered(decision), Some(seq), after.status()))
}

/// Appends an event with the next sequence, inside the caller's immediate transaction.
fn append(
    tx: &Transaction<'_>,
    run_id: &str,
    kind: &str,
    payload: &Value,
    now_ms: i64,
) -> Result<i64, Failure> {
    let seq: i64 = tx.query_row_cached(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = ?1",
        [run_id],
        |row| row.get(0),
    )?;
    tx.execute_cached(
        "INSERT INTO run_events (run_id, seq, kind, payload, time_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![run_id, seq, kind, payload.to_string(), now_ms],
    )?;
    Ok(seq)
}

fn read_run_status(conn: &Connection, id: &str) -> Result<Option<RunState>, Failure> {
    let text: Option<String> = conn
        .query_row_cached("SELECT status FROM runs WHERE id = ?1", [id], |row| {
            row.get(0)
        })
        .optional()?;
    Ok(text.as_deref().and_then(RunState::parse))
}

/// R4, R12: a cancel drops the run's pending decisions, inside the cancel's transaction.
pub(crate) fn drop_pending(conn: &Connection, run_id: &str, now_ms: i64) -> Result<(), Failure> {
    conn.execute_cached(
        "UPDATE decisions SET status = 'dropped', answered_ms = ?1
         WHERE run_id = ?2 AND status = 'pending'",
        params![now_ms, run_id],
    )?;
    Ok(())
}

fn read(conn: &Connection, id: &str) -> Result<Option<Decision>, Failure> {
    let row = conn
        .query_row(
            &format!("SELECT {DECISION_COLUMNS} FROM decisions WHERE id = ?1"),
            [id],
            columns,
        )
        .optional()?;
    row.map(decode).transpose()
}

fn columns(row: &Row<'_>) -> rusqlite::Result<StoredDecision> {
    Ok(StoredDecision {
        id: row.get(0)?,
        run_id: row.get(1)?,
        kind: row.get(2)?,
        round: row.get(3)?,
        call_id: row.get(4)?,
        tool: row.get(5)?,
        arguments: row.get(6)?,
        arguments_hash: row.get(7)?,
        message: row.get(8)?,
        requested_schema: row.get(9)?,
        asked_ms: row.get(10)?,
        expires_ms: row.get(11)?,
        status: row.get(12)?,
        answer: row.get(13)?,
        reason: row.get(14)?,
        answer_arguments: row.get(15)?,
        content: row.get(16)?,
        actor: row.get(17)?,
        answered_ms: row.get(18)?,
        input_key: row.get(19)?,
        request_state: row.get(20)?,
        in_call: row.get(21)?,
    })
}

/// Stored text this build cannot read is damage, reported, never a panic.
fn decode(c: StoredDecision) -> Result<Decision, Failure> {
    rows::decision(c).map_err(Failure::Corrupt)
}

#[cfg(test)]
mod tests {
    use runwarden_runtime::decision::{DecisionFilter, DecisionStatus};
    use rusqlite::Connection;

    use super::list_sql;

    /// Every filtered list of decisions reads an index: the pending ones (the console, the
    /// expiry sweep every reaper pass) are found without reading every decision answered.
    #[test]
    fn each_filtered_list_of_decisions_reads_an_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::migrate::migrate(&mut conn).unwrap();
        let pending = Some(DecisionStatus::Pending);
        let shapes = [
            (pending, None, None, "decisions_status_id"),
            (None, Some("run-1"), None, "decisions_run"),
            (None, None, Some(1), "decisions_status_"),
            (pending, Some("run-1"), None, "decisions_"),
        ];
        for (status, run_id, due_by_ms, index) in shapes {
            let filter = DecisionFilter {
                status,
                run_id: run_id.map(str::to_string),
                due_by_ms,
                limit: 50,
            };
            let params =
                rusqlite::params![status.map(DecisionStatus::as_str), run_id, due_by_ms, 50];
            let plan = crate::plan::query_plan(&conn, &list_sql(&filter), params);
            assert!(plan.contains(index), "{filter:?}: {plan}");
            assert!(plan.starts_with("SEARCH"), "{filter:?}: {plan}");
        }
    }
}
