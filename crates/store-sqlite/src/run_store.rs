//! `RunStore` for SQLite: run rows and their events (R1), the lease (R3), the cancel
//! (R4), the status probe (R5, R6) and the write fence (R7).
//!
//! Every write that could race is one guarded UPDATE whose affected-row count decides.
//! Where an answer needs the row's state as well (a cancel's `previous`, a refused settle),
//! the read and the guarded update share one `BEGIN IMMEDIATE` transaction, so another
//! process cannot change the row between them.

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
use runwarden_runtime::{Change, ChangeFeed, KeyedCreate, RunCreateKeyed, RunState};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use serde_json::Value;

use crate::SqliteStore;
use crate::cached::Cached;
use crate::connection::durably;
use crate::failure::Failure;
use crate::publish::publish_status;

pub(crate) const RUN_COLUMNS: &str = "id, agent, status, termination_reason, request, claimed_by, lease_expires_ms, \
                           pending_effect, requeue_count, rounds, correlation, created_ms, updated_ms, claim_epoch, \
                           started_by, tags";

const READING_STATUS: &str = "reading a run's status";
/// Up to this many runs, a status read runs on the caller's thread (`quick_read`).
const QUICK_STATUS_IDS: usize = 4;
const SETTLING: &str = "settling a run";

/// Runs by state, in one statement (one snapshot): the ended ones from `run_counts`, which
/// migration 0024's triggers keep, and the ones under way from `runs_status_id`. Ended runs
/// are most of the table, and were read one by one before.
const RUN_COUNTS: &str = "SELECT status, SUM(n) FROM (
         SELECT status, n FROM run_counts
         UNION ALL
         SELECT status, COUNT(*) AS n FROM runs INDEXED BY runs_status_id
         WHERE status IN ('queued', 'running', 'waiting_for_approval')
         GROUP BY status
     ) GROUP BY status HAVING SUM(n) > 0 ORDER BY status";

#[async_trait]
impl RunStore for SqliteStore {
    async fn run_create(&self, params: RunCreate) -> Result<Run, StoreError> {
        let run = self
            .run("creating a run", move |conn| insert_run(conn, params))
            .await?;
        publish_status(self.feed(), &run.id, run.status);
        Ok(run)
    }

    async fn run_create_keyed(&self, params: RunCreateKeyed) -> Result<KeyedCreate, StoreError> {
        self.create_keyed(params).await
    }

    async fn run_get(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let id = id.to_owned();
        self.run("reading a run", move |conn| {
            let row = conn
                .query_row_cached(
                    &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                    [&id],
                    run_columns,
                )
                .optional()?;
            row.map(run_row).transpose()
        })
        .await
    }

    async fn run_statuses(&self, ids: &[String]) -> Result<Vec<(String, RunState)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // R6 (amended): one query for every run the watcher follows, however many calls
        // are in flight. `json_each` takes the whole list as one parameter. It runs on a
        // read-only connection, so the watcher never queues behind the writer; a step's
        // question about its own run (a handful of ids) is answered on the caller's thread.
        // One id, a step asking about its own run, is a plain lookup: no list to encode and
        // no temporary table for the IN.
        let (sql, list) = match ids {
            [one] => ("SELECT id, status FROM runs WHERE id = ?1", one.clone()),
            _ => (
                "SELECT id, status FROM runs WHERE id IN (SELECT value FROM json_each(?1))",
                serde_json::to_string(ids).map_err(|e| StoreError::new(READING_STATUS, e))?,
            ),
        };
        let read = move |conn: &rusqlite::Connection| -> Result<Vec<(String, RunState)>, Failure> {
            let mut stmt = conn.prepare_cached(sql)?;
            let rows = stmt
                .query_map([&list], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(id, text)| {
                    let status = parse_status(&id, &text)?;
                    Ok((id, status))
                })
                .collect()
        };
        if ids.len() <= QUICK_STATUS_IDS {
            self.quick_read(READING_STATUS, read).await
        } else {
            self.probe(READING_STATUS, move |conn| read(conn)).await
        }
    }

    fn change_feed(&self) -> &ChangeFeed {
        self.feed()
    }

    async fn run_cancel(&self, id: &str, now_ms: i64) -> Result<CancelAnswer, StoreError> {
        let run_id = id.to_owned();
        let id = id.to_owned();
        let answer = self
            .run("cancelling a run", move |conn| {
                // R4: the read and the guarded update share one immediate transaction, so
                // `previous` is the state the cancel really left.
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let (previous, final_event) = match rules::cancel_step(read_status(&tx, &id)?) {
                    CancelStep::Answer(answer) => return Ok((answer, None)),
                    CancelStep::Cancel {
                        previous,
                        final_event,
                    } => (previous, final_event),
                };
                // R4: the stored request goes (nothing may resume the run); pending_effect and
                // claimed_by stay, so the reaper and people can see a cancelled mid-write run (R7).
                let changed = tx.execute_cached(
                    "UPDATE runs SET status = 'cancelled', request = NULL, termination_reason = ?1,
                     updated_ms = ?2
                 WHERE id = ?3 AND status NOT IN ('completed', 'failed', 'cancelled')",
                    params![CANCEL_REASON, now_ms, id],
                )?;
                if changed != 1 {
                    return Err(rules::cancel_raced(&id).into());
                }
                // R12: the cancel wins over a decision the run waits on.
                crate::decision_store::drop_pending(&tx, &id, now_ms)?;
                // R8: no segment holds a queued or parked run, so its final event is
                // written here, with the status change.
                let seq = match final_event {
                    Some(body) => crate::final_event::append_final(&tx, &id, &body, now_ms)?,
                    None => None,
                };
                tx.commit()?;
                Ok((CancelAnswer::Cancelled { previous }, seq))
            })
            .await?;
        let (answer, seq) = answer;
        if matches!(answer, CancelAnswer::Cancelled { .. }) {
            publish_status(self.feed(), &run_id, RunState::Cancelled);
        }
        if let Some(seq) = seq {
            self.feed().publish(Change::Appended { run_id, seq });
        }
        Ok(answer)
    }

    async fn run_heartbeat(&self, params: Heartbeat) -> Result<bool, StoreError> {
        self.run("renewing a run's lease", move |conn| {
            // R3: a renewal that matches no row means the lease was lost. A cancelled run
            // still belongs to its segment until the segment records its boundary step (R5).
            let changed = conn.execute_cached(
                "UPDATE runs SET lease_expires_ms = ?1, updated_ms = ?2
                 WHERE id = ?3 AND claimed_by = ?4 AND claim_epoch = ?5
                   AND status IN ('running', 'cancelled')",
                params![
                    params.lease_until_ms,
                    params.now_ms,
                    params.id,
                    params.owner,
                    params.epoch
                ],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn run_fence_mark(&self, params: FenceMark) -> Result<bool, StoreError> {
        let sync = self.syncs_promises();
        self.run("marking a run's write fence", move |conn| {
            // R7: no lease of this claim or no running run, no write. The mark is
            // written after the call's audit intent and right before the first byte, so
            // nothing later syncs it: it commits synced itself (`durably`; an autocommit
            // statement stepped to its end, so a failed commit or sync is an error and no
            // byte leaves). A power cut cannot take back a mark whose write may have gone.
            let marked = durably(conn, sync, |conn| {
                Ok(conn.execute_cached(
                    "UPDATE runs SET pending_effect = ?1, lease_expires_ms = ?2, updated_ms = ?3
                     WHERE id = ?4 AND claimed_by = ?5 AND claim_epoch = ?6 AND status = 'running'",
                    params![
                        params.effect,
                        params.lease_until_ms,
                        params.now_ms,
                        params.id,
                        params.owner,
                        params.epoch
                    ],
                )? == 1)
            });
            // A mark whose commit may have landed is re-read: then the fence is in place
            // and the write may go. Not when the sync itself failed: the mark may then be
            // readable but not on disk, and the write must not leave on it.
            if let Err(failure) = &marked
                && sync_failed(failure)
            {
                return marked;
            }
            // A later renewal only moves the lease further out.
            crate::confirm::or_reread(conn, "marking a run's write fence", marked, |conn| {
                let held = conn
                    .query_row_cached(
                        "SELECT 1 FROM runs WHERE id = ?1 AND claimed_by = ?2 AND claim_epoch = ?3
                             AND status = 'running' AND pending_effect = ?4
                             AND lease_expires_ms >= ?5",
                        params![
                            params.id,
                            params.owner,
                            params.epoch,
                            params.effect,
                            params.lease_until_ms
                        ],
                        |_| Ok(true),
                    )
                    .optional()?;
                Ok(held)
            })
        })
        .await
    }

    async fn run_event_append(&self, params: EventAppend) -> Result<Option<i64>, StoreError> {
        rules::check_event_append(&params)?;
        // Group-committed with the appends of the runs beside it (`append_batch`).
        self.append_event(params).await
    }

    async fn run_settle(&self, params: RunSettle) -> Result<SettleAnswer, StoreError> {
        rules::check_settle_status(params.status)?;
        let (run_id, status) = (params.id.clone(), params.status);
        let answer = self
            .run(SETTLING, move |conn| {
                let settled = settle(conn, &params);
                // A settle whose commit may have landed is re-read: the row then says so.
                crate::confirm::or_reread(conn, SETTLING, settled, |conn| {
                    let held = conn
                        .query_row_cached(
                            "SELECT 1 FROM runs WHERE id = ?1 AND claimed_by = ?2
                                 AND claim_epoch = ?3 AND status = ?4 AND termination_reason = ?5",
                            params![
                                params.id,
                                params.owner,
                                params.epoch,
                                params.status.as_str(),
                                params.reason
                            ],
                            |_| Ok(SettleAnswer::Settled),
                        )
                        .optional()?;
                    Ok(held)
                })
            })
            .await?;
        if answer == SettleAnswer::Settled {
            publish_status(self.feed(), &run_id, status);
        }
        Ok(answer)
    }

    async fn run_list(&self, filter: RunFilter) -> Result<Vec<Run>, StoreError> {
        self.scan("listing runs", move |conn| {
            let limit = runwarden_runtime::store::page_limit(filter.limit);
            let mut stmt = conn.prepare_cached(&list_sql(&filter))?;
            let status = filter.status.map(RunState::as_str);
            let rows = stmt
                .query_map(
                    params![status, filter.agent, filter.before_id, limit],
                    run_columns,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(run_row).collect()
        })
        .await
    }

    async fn run_counts(&self) -> Result<Vec<(RunState, u64)>, StoreError> {
        self.scan("counting runs", |conn| {
            let mut stmt = conn.prepare_cached(RUN_COUNTS)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(status, n)| Ok((parse_status("(count)", &status)?, n.max(0) as u64)))
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
        let id = id.to_owned();
        self.run("listing a run's events", move |conn| {
            read_events(conn, &id, after_seq, limit)
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

/// Inserts a new run (R1, R3), inside the caller's transaction when there is one.
pub(crate) fn insert_run(conn: &Connection, params: RunCreate) -> Result<Run, Failure> {
    let request = params.request.as_ref().map(Value::to_string);
    let tags = Value::from(params.origin.tags.clone()).to_string();
    let run = rules::new_run(params);
    let inserted = conn.execute_cached(
        "INSERT INTO runs (id, agent, status, request, claimed_by, lease_expires_ms,
                           correlation, created_ms, updated_ms, claim_epoch, started_by, tags)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10, ?11)
         ON CONFLICT (id) DO NOTHING",
        params![
            run.id,
            run.agent,
            run.status.as_str(),
            request,
            run.claimed_by,
            run.lease_expires_ms,
            run.correlation,
            run.created_ms,
            run.claim_epoch,
            run.origin.started_by,
            tags,
        ],
    )?;
    if inserted == 0 {
        return Err(rules::duplicate_run(&run.id).into());
    }
    Ok(run)
}

fn read_status(conn: &Connection, id: &str) -> Result<Option<RunState>, Failure> {
    let status: Option<String> = conn
        .query_row_cached("SELECT status FROM runs WHERE id = ?1", [id], |row| {
            row.get(0)
        })
        .optional()?;
    status.map(|text| parse_status(id, &text)).transpose()
}

/// A stored status this build does not know is damage, reported, never a panic.
fn parse_status(id: &str, text: &str) -> Result<RunState, Failure> {
    rows::run_status(id, text).map_err(Failure::Corrupt)
}

pub(crate) fn run_columns(row: &Row<'_>) -> rusqlite::Result<StoredRun> {
    Ok(StoredRun {
        id: row.get(0)?,
        agent: row.get(1)?,
        status: row.get(2)?,
        termination_reason: row.get(3)?,
        request: row.get(4)?,
        claimed_by: row.get(5)?,
        lease_expires_ms: row.get(6)?,
        pending_effect: row.get(7)?,
        requeue_count: row.get(8)?,
        rounds: row.get(9)?,
        correlation: row.get(10)?,
        created_ms: row.get(11)?,
        updated_ms: row.get(12)?,
        claim_epoch: row.get(13)?,
        started_by: row.get(14)?,
        tags: row.get(15)?,
    })
}

/// The list of runs for `filter`'s shape: only the filters asked for are in the text, so
/// the planner sees each one and walks `runs_status_id` or `runs_agent_id` from the newest
/// end (`?1 IS NULL OR status = ?1` hid them, and a rare state was found by reading every
/// run). The parameters keep their numbers: state, agent, before, limit.
fn list_sql(filter: &RunFilter) -> String {
    let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE 1 = 1");
    if filter.status.is_some() {
        sql.push_str(" AND status = ?1");
    }
    if filter.agent.is_some() {
        sql.push_str(" AND agent = ?2");
    }
    if filter.before_id.is_some() {
        sql.push_str(" AND id < ?3");
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?4");
    sql
}

/// A run row, its status, request and counters checked.
pub(crate) fn run_row(c: StoredRun) -> Result<Run, Failure> {
    rows::run(c).map_err(Failure::Corrupt)
}

/// A segment's settle, guarded by its claim, in one transaction.
fn settle(conn: &mut Connection, params: &RunSettle) -> Result<SettleAnswer, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let changed = tx.execute_cached(
        "UPDATE runs SET status = ?1, termination_reason = ?2, updated_ms = ?3
     WHERE id = ?4 AND claimed_by = ?5 AND claim_epoch = ?6 AND status = 'running'",
        params![
            params.status.as_str(),
            params.reason,
            params.now_ms,
            params.id,
            params.owner,
            params.epoch
        ],
    )?;
    let answer = if changed == 1 {
        SettleAnswer::Settled
    } else {
        // A cancel that won the row is never overwritten; otherwise the lease is lost.
        rules::lost_row(read_status(&tx, &params.id)?).into()
    };
    tx.commit()?;
    Ok(answer)
}

/// Whether `failure` is a failed sync of the log (`fsync`/`fdatasync`): the commit's
/// frames may be readable by this connection and still not be on disk.
fn sync_failed(failure: &Failure) -> bool {
    matches!(failure, Failure::Sql(rusqlite::Error::SqliteFailure(e, _))
        if e.extended_code == rusqlite::ffi::SQLITE_IOERR_FSYNC
            || e.extended_code == rusqlite::ffi::SQLITE_IOERR_DIR_FSYNC)
}

const ALL_EVENTS: &str = "SELECT run_id, seq, kind, payload, time_ms FROM run_events
     WHERE run_id = ?1 AND seq > ?2 ORDER BY seq";
const SOME_EVENTS: &str = "SELECT run_id, seq, kind, payload, time_ms FROM run_events
     WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";

/// An event row as stored: run, seq, kind, payload text, time.
type EventColumns = (String, i64, String, String, i64);

fn event_columns(row: &rusqlite::Row<'_>) -> rusqlite::Result<EventColumns> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

/// Events of run `id` with a sequence greater than `after_seq`, oldest first, at most
/// `limit` (0 = all).
pub(crate) fn read_events(
    conn: &rusqlite::Connection,
    id: &str,
    after_seq: i64,
    limit: u32,
) -> Result<Vec<RunEvent>, Failure> {
    // A LIMIT bound from a parameter makes SQLite prepare the statement again on every new
    // binding, so reading every event (a segment's start) has a statement without one.
    let rows = if limit == 0 {
        conn.prepare_cached(ALL_EVENTS)?
            .query_map(params![id, after_seq], event_columns)?
            .collect::<Result<Vec<_>, _>>()?
    } else {
        conn.prepare_cached(SOME_EVENTS)?
            .query_map(params![id, after_seq, i64::from(limit)], event_columns)?
            .collect::<Result<Vec<_>, _>>()?
    };
    rows.into_iter()
        .map(|(run_id, seq, kind, payload, time_ms)| {
            let payload = serde_json::from_str(&payload).map_err(|e| {
                Failure::Corrupt(format!(
                    "event {seq} of run {run_id} has a payload that is not JSON ({e})"
                ))
            })?;
            Ok(RunEvent {
                run_id,
                seq,
                kind,
                payload,
                time_ms,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, StatementStatus};

    use runwarden_runtime::RunState;
    use runwarden_runtime::store::RunFilter;

    use super::{ALL_EVENTS, RUN_COUNTS, SOME_EVENTS, list_sql, read_events};

    /// Every list of runs walks an index from the newest end: none reads every run to find
    /// a rare state or agent, and none sorts.
    #[test]
    fn each_list_of_runs_walks_an_index_without_sorting() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::migrate::migrate(&mut conn).unwrap();
        let shapes = [
            (None, None, None, "sqlite_autoindex_runs_1"),
            (Some(RunState::Failed), None, None, "runs_status_id"),
            (None, Some("helpdesk"), None, "runs_agent_id"),
            (Some(RunState::Failed), None, Some("0190"), "runs_status_id"),
            (None, Some("helpdesk"), Some("0190"), "runs_agent_id"),
            (None, None, Some("0190"), "sqlite_autoindex_runs_1"),
        ];
        for (status, agent, before, index) in shapes {
            let filter = RunFilter {
                status,
                agent: agent.map(str::to_string),
                before_id: before.map(str::to_string),
                limit: 50,
            };
            let params = rusqlite::params![status.map(RunState::as_str), agent, before, 50];
            let plan = crate::plan::query_plan(&conn, &list_sql(&filter), params);
            assert!(plan.contains(index), "{filter:?}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{filter:?}: {plan}");
        }
        let both = RunFilter {
            status: Some(RunState::Failed),
            agent: Some("helpdesk".into()),
            ..RunFilter::default()
        };
        let params = rusqlite::params!["failed", "helpdesk", None::<String>, 50];
        let plan = crate::plan::query_plan(&conn, &list_sql(&both), params);
        assert!(plan.contains("_id"), "{plan}");
    }

    /// The counts read the ended runs' few rows and the entries of runs under way in
    /// `runs_status_id`, never every run.
    #[test]
    fn the_counts_read_no_ended_run() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::migrate::migrate(&mut conn).unwrap();
        let plan = crate::plan::query_plan(&conn, RUN_COUNTS, []);
        assert!(!plan.contains("SCAN runs"), "{plan}");
        assert!(
            plan.contains("SEARCH runs USING COVERING INDEX runs_status_id (status=?)"),
            "{plan}"
        );
    }

    /// Reading a run's events again (every segment's start) reuses the prepared statement;
    /// a LIMIT bound from a parameter would have it prepared again each time.
    #[test]
    fn reading_every_event_again_is_not_prepared_again() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE run_events (run_id TEXT, seq INTEGER, kind TEXT, payload TEXT,
                 time_ms INTEGER, PRIMARY KEY (run_id, seq));
             INSERT INTO run_events VALUES ('r', 1, 'run_started', '{}', 1);",
        )
        .unwrap();
        for _ in 0..3 {
            assert_eq!(read_events(&conn, "r", 0, 0).unwrap().len(), 1);
        }
        let all = conn.prepare_cached(ALL_EVENTS).unwrap();
        assert_eq!(all.get_status(StatementStatus::RePrepare), 0);
        drop(all);
        for limit in 1..4 {
            assert_eq!(read_events(&conn, "r", 0, limit).unwrap().len(), 1);
        }
        let some = conn.prepare_cached(SOME_EVENTS).unwrap();
        assert!(
            some.get_status(StatementStatus::RePrepare) > 0,
            "the LIMIT statement shows the cost this avoids"
        );
    }
}
