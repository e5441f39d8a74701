//! Run events, appended under each claim's guard (R1, R5, R7), with group commit: while
//! a few appends are in flight, the next ones wait and then share one transaction.
//!
//! An append that finds fewer than [`IN_FLIGHT`] transactions open runs alone, on its
//! caller's task, exactly as before batching: BEGIN and the guard in one flight, the
//! insert and COMMIT in the next. Appends that arrive while that many are open queue up.
//! When one transaction ends, the queue is taken by a task of its own, up to
//! `MAX_BATCH` appends of distinct runs, in one transaction of the same two flights:
//! one guarded UPDATE for all of them (`unnest` of one array per column), and one INSERT
//! of the events of every append whose guard held, each run's sequence numbers read
//! after its row lock as a lone append reads them.
//!
//! Every answer is as sure as a lone append's:
//! - a refused guard refuses that append alone (`None`);
//! - when the server refuses the batch (a statement error, nothing of it stored), each
//!   append is tried again alone, so one bad append cannot fail the others;
//! - when the batch's outcome is unknown (the connection broke or went silent), each
//!   append is re-read on its own, as a lone append is.
//!
//! A queued caller that goes away does not strand the others: the task holds the answers,
//! and its own append may still land, as a store call's work on the server always could.

use std::collections::{HashMap, HashSet};

use runwarden_base::StoreError;
use runwarden_runtime::store::EventAppend;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use crate::PgStore;
use crate::append_queue::{Answer, Pending};
use crate::connection::Conn;
use crate::failure::Failure;
use crate::flight::{begin_with, commit_with, rollback};

const APPENDING: &str = "appending a run event";

/// How many append transactions one store keeps open before the next appends queue up
/// and share one: enough that a run whose row another session holds locked does not stall
/// every other run's appends, few enough that appends side by side are grouped.
const IN_FLIGHT: usize = 2;

impl PgStore {
    /// Appends one run event under its claim's guard; `None` when the guard refused it.
    pub(crate) async fn append_event(&self, append: EventAppend) -> Answer {
        let payload = append.payload.to_string();
        // One look at the queue decides, so no slot can end between the choice and the push.
        let queued = {
            let mut queue = self.appends().lock();
            if queue.in_flight < IN_FLIGHT {
                queue.in_flight += 1;
                Err((append, payload))
            } else {
                let (reply, answer) = oneshot::channel();
                queue.pending.push_back(Pending {
                    append,
                    payload,
                    reply,
                });
                Ok(answer)
            }
        };
        let answer = match queued {
            Ok(answer) => answer,
            Err((append, payload)) => {
                // Let go of the slot however this ends, a caller that went away included.
                let _slot = Slot(self);
                return self.append_alone(&append, &payload).await;
            }
        };
        answer.await.map_err(|_| {
            StoreError::new(
                APPENDING,
                "the append was dropped unanswered (the process is shutting down); whether it was stored is unknown",
            )
        })?
    }

    /// One append in a transaction of its own, its commit confirmed.
    async fn append_alone(&self, params: &EventAppend, payload: &str) -> Answer {
        let result = self
            .with(APPENDING, async {
                let client = self.client().await?;
                let (guard, insert) =
                    statements(&client, GUARD_ONE, insert_one_sql(params)).await?;
                let round = params.round.map(i64::from);
                let (end_status, end_reason) = match &params.end {
                    Some(end) => (Some(end.status.as_str()), Some(end.reason.as_str())),
                    None => (None, None),
                };
                let guarded: [&(dyn ToSql + Sync); 8] = [
                    &params.clear_fence,
                    &round,
                    &params.now_ms,
                    &params.id,
                    &params.owner,
                    &params.epoch,
                    &end_status,
                    &end_reason,
                ];
                let changed = begin_with(&client, async {
                    Ok(client.execute(&guard, &guarded).await?)
                })
                .await?;
                if changed != 1 {
                    // The guard matched nothing: the transaction ends having stored nothing.
                    rollback(&client).await;
                    return Ok(None);
                }
                commit_with(&client, insert_one(&client, &insert, params, payload)).await
            })
            .await;
        self.confirm(result, APPENDING, || reread(self, params, payload))
            .await
    }

    /// Takes the queue in batches on this task until it is empty, answering every append.
    async fn drain(&self, mut batch: Vec<Pending>) {
        loop {
            self.answer_batch(batch).await;
            let mut queue = self.appends().lock();
            if queue.pending.is_empty() {
                return;
            }
            batch = queue.take_batch();
        }
    }

    /// Stores `batch` in one transaction and sends each append its answer.
    async fn answer_batch(&self, batch: Vec<Pending>) {
        if batch.len() == 1 {
            let one = batch.into_iter().next().expect("one append");
            let answer = self.append_alone(&one.append, &one.payload).await;
            let _ = one.reply.send(answer);
            return;
        }
        let result = {
            let work: Vec<(&EventAppend, &str)> = batch
                .iter()
                .map(|p| (&p.append, p.payload.as_str()))
                .collect();
            self.with(APPENDING, async {
                let client = self.client().await?;
                append_together(&client, &work).await
            })
            .await
        };
        for p in batch {
            let answer = match &result {
                // Its row was held by another session: it waits alone, not the batch.
                Ok(together) if together.skipped.contains(&p.append.id) => {
                    self.spawn_alone(p);
                    continue;
                }
                Ok(together) => Ok(together.seqs.get(&p.append.id).copied()),
                Err(error) if runwarden_runtime::outcome_unknown(error) => {
                    let lost = Err(error.clone());
                    self.confirm(lost, APPENDING, || reread(self, &p.append, &p.payload))
                        .await
                }
                // The server refused the batch and stored none of it: each alone.
                Err(_) => {
                    self.spawn_alone(p);
                    continue;
                }
            };
            let _ = p.reply.send(answer);
        }
    }

    /// Appends `p` alone on a task of its own, which answers it: a wait for its run's row
    /// holds up no other append.
    fn spawn_alone(&self, p: Pending) {
        let store = self.clone();
        tokio::spawn(async move {
            let answer = store.append_alone(&p.append, &p.payload).await;
            let _ = p.reply.send(answer);
        });
    }
}

/// An open append transaction's place in [`IN_FLIGHT`]. Dropped when the transaction is
/// over (or its caller went away): the queue, if any, is handed to a task of its own.
struct Slot<'a>(&'a PgStore);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut queue = self.0.appends().lock();
        if queue.pending.is_empty() {
            queue.in_flight -= 1;
            return;
        }
        let batch = queue.take_batch();
        drop(queue);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left to run it (the process is ending): the dropped senders
            // answer each append that its outcome is unknown.
            let mut queue = self.0.appends().lock();
            queue.in_flight -= 1;
            queue.pending.clear();
            return;
        };
        let store = self.0.clone();
        runtime.spawn(async move {
            let _slot = Slot(&store);
            store.drain(batch).await;
        });
    }
}

/// What a lone append's re-read finds: the same kind, payload and time is this append.
/// A step whose answer was lost may be stored: read as unstored, a recorded write would
/// end FENCED_WRITE.
async fn reread(
    store: &PgStore,
    params: &EventAppend,
    payload: &str,
) -> Result<Option<Option<i64>>, Failure> {
    let client = store.client().await?;
    let row = client
        .query_opt(
            "SELECT seq FROM run_events
             WHERE run_id = $1 AND kind = $2 AND time_ms = $3 AND payload = $4
             ORDER BY seq DESC LIMIT 1",
            &[&params.id, &params.kind, &params.now_ms, &payload],
        )
        .await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?.map(Some))
}

/// Both statements, prepared before the flights: inside one, COMMIT could leave before
/// the statement's preparation.
async fn statements(
    client: &Conn,
    guard: &str,
    insert: &str,
) -> Result<(tokio_postgres::Statement, tokio_postgres::Statement), Failure> {
    Ok((
        client.prepare_cached(guard).await?,
        client.prepare_cached(insert).await?,
    ))
}

/// The guard decides, and its row lock makes every other appender of this run, on any
/// node, wait until this transaction ends: MAX(seq) in the insert, a statement of its
/// own, is read after the previous appender committed, so a sequence is never taken twice
/// (R1). The owner of a running run, or of a run cancelled under it (R5: it records its
/// boundary step). R7: the fence is cleared on a running run only; a cancelled mid-write
/// run keeps its mark. Rounds never go down. The claim epoch is checked beside the owner.
/// A final event with `end` moves a running run to its final status in the same
/// transaction (one truth per run); a cancel that won the row refuses it.
const GUARD_ONE: &str = "UPDATE runs SET
     pending_effect = CASE WHEN $1 AND status = 'running' THEN NULL ELSE pending_effect END,
     rounds = GREATEST(rounds, COALESCE($2, rounds)),
     termination_reason = CASE WHEN $7::TEXT IS NULL THEN termination_reason ELSE $8 END,
     status = COALESCE($7::TEXT, status),
     updated_ms = $3
 WHERE id = $4 AND claimed_by = $5 AND claim_epoch = $6
   AND (status = 'running' OR ($7::TEXT IS NULL AND status = 'cancelled'))";

/// [`GUARD_ONE`] for many runs at once, one array per column. It locks the rows no other
/// session holds (in the order of their ids) and passes over the others, so a batch never
/// waits for a row: each locked run, and whether its guard held.
const GUARD_MANY: &str = "WITH a AS (
     SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::BOOL[], $5::BIGINT[],
                          $6::BIGINT[], $7::TEXT[], $8::TEXT[])
         AS a (id, owner, epoch, clear_fence, round, now_ms, end_status, end_reason)
 ), locked AS (
     SELECT runs.id FROM runs JOIN a ON runs.id = a.id
     ORDER BY runs.id FOR UPDATE OF runs SKIP LOCKED
 ), held AS (
     UPDATE runs SET
         pending_effect = CASE WHEN a.clear_fence AND runs.status = 'running' THEN NULL
                               ELSE runs.pending_effect END,
         rounds = GREATEST(runs.rounds, COALESCE(a.round, runs.rounds)),
         termination_reason = CASE WHEN a.end_status IS NULL THEN runs.termination_reason
                                   ELSE a.end_reason END,
         status = COALESCE(a.end_status, runs.status),
         updated_ms = a.now_ms
     FROM a
     WHERE runs.id = a.id AND runs.id IN (SELECT id FROM locked)
       AND runs.claimed_by = a.owner AND runs.claim_epoch = a.epoch
       AND (runs.status = 'running' OR (a.end_status IS NULL AND runs.status = 'cancelled'))
     RETURNING runs.id
 )
 SELECT locked.id, held.id IS NOT NULL FROM locked LEFT JOIN held ON held.id = locked.id";

/// The events of many appends: each row's run, its place among its run's new rows
/// (0, or 0 and 1 with an earlier event), kind, payload and time; every run's numbers
/// follow its stored maximum.
const INSERT_MANY: &str = "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
 SELECT e.run_id, next.seq + e.n, e.kind, e.payload, e.time_ms
 FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[])
      AS e (run_id, n, kind, payload, time_ms)
 CROSS JOIN LATERAL (SELECT COALESCE(MAX(seq), 0) + 1 AS seq FROM run_events
                     WHERE run_id = e.run_id) AS next
 RETURNING run_id, seq";

/// The statement that inserts a lone append's rows: the event, and the one before it
/// when there is one (the earlier one takes the next sequence number, this one the
/// number after).
fn insert_one_sql(params: &EventAppend) -> &'static str {
    if params.before.is_some() {
        "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
         SELECT $1::TEXT, next.seq + e.n, e.kind, e.payload, $4::BIGINT
         FROM (SELECT COALESCE(MAX(seq), 0) + 1 AS seq FROM run_events
               WHERE run_id = $1::TEXT) AS next,
              (VALUES (0, $5::TEXT, $6::TEXT), (1, $2::TEXT, $3::TEXT)) AS e (n, kind, payload)
         RETURNING seq"
    } else {
        "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
         SELECT $1::TEXT, COALESCE(MAX(seq), 0) + 1, $2::TEXT, $3::TEXT, $4::BIGINT
         FROM run_events WHERE run_id = $1::TEXT
         RETURNING seq"
    }
}

/// A lone append's rows after its guard; this event's sequence number.
async fn insert_one(
    client: &Conn,
    insert: &tokio_postgres::Statement,
    params: &EventAppend,
    payload: &str,
) -> Result<Option<i64>, Failure> {
    type Param<'a> = &'a (dyn ToSql + Sync);
    let earlier = params
        .before
        .as_ref()
        .map(|b| (b.kind.as_str(), b.payload.to_string()));
    let mut values: Vec<Param<'_>> = vec![&params.id, &params.kind, &payload, &params.now_ms];
    if let Some((kind, details)) = &earlier {
        values.extend([kind as Param<'_>, details as Param<'_>]);
    }
    let mut last = None;
    for row in client.query(insert, &values).await? {
        last = last.max(Some(row.try_get::<_, i64>(0)?));
    }
    Ok(last)
}

/// What a batch's transaction did: the sequence number of each run whose guard held (its
/// last row's, so an append's own event's), and the runs whose rows another session held
/// locked, left for appends of their own. A run in neither was refused by its guard.
struct Together {
    seqs: HashMap<String, i64>,
    skipped: HashSet<String>,
}

/// Appends of distinct runs in one transaction, passing over the rows other sessions hold.
async fn append_together(
    client: &Conn,
    work: &[(&EventAppend, &str)],
) -> Result<Together, Failure> {
    let (guard, insert) = statements(client, GUARD_MANY, INSERT_MANY).await?;
    let mut sorted: Vec<&(&EventAppend, &str)> = work.iter().collect();
    sorted.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    let guards = GuardColumns::of(sorted.iter().map(|(a, _)| *a));
    let locked: HashMap<String, bool> = begin_with(client, async {
        let rows = client.query(&guard, &guards.params()).await?;
        rows.iter()
            .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, bool>(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(Failure::from)
    })
    .await?;
    let skipped = sorted
        .iter()
        .filter(|(a, _)| !locked.contains_key(&a.id))
        .map(|(a, _)| a.id.clone())
        .collect();
    if !locked.values().any(|held| *held) {
        rollback(client).await;
        let seqs = HashMap::new();
        return Ok(Together { seqs, skipped });
    }
    let held = |a: &EventAppend| locked.get(&a.id).copied().unwrap_or(false);
    let rows = EventColumns::of(sorted.iter().filter(|(a, _)| held(a)).copied());
    let seqs = commit_with(client, async {
        let mut seqs = HashMap::new();
        for row in client.query(&insert, &rows.params()).await? {
            let (run, seq): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            let last = seqs.entry(run).or_insert(seq);
            *last = seq.max(*last);
        }
        Ok(seqs)
    })
    .await?;
    Ok(Together { seqs, skipped })
}

/// [`GUARD_MANY`]'s arrays.
#[derive(Default)]
struct GuardColumns<'a> {
    id: Vec<&'a str>,
    owner: Vec<&'a str>,
    epoch: Vec<i64>,
    clear_fence: Vec<bool>,
    round: Vec<Option<i64>>,
    now_ms: Vec<i64>,
    end_status: Vec<Option<&'a str>>,
    end_reason: Vec<Option<&'a str>>,
}

impl<'a> GuardColumns<'a> {
    fn of(appends: impl Iterator<Item = &'a EventAppend>) -> Self {
        let mut c = Self::default();
        for a in appends {
            c.id.push(&a.id);
            c.owner.push(&a.owner);
            c.epoch.push(a.epoch);
            c.clear_fence.push(a.clear_fence);
            c.round.push(a.round.map(i64::from));
            c.now_ms.push(a.now_ms);
            c.end_status.push(a.end.as_ref().map(|e| e.status.as_str()));
            c.end_reason.push(a.end.as_ref().map(|e| e.reason.as_str()));
        }
        c
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.id,
            &self.owner,
            &self.epoch,
            &self.clear_fence,
            &self.round,
            &self.now_ms,
            &self.end_status,
            &self.end_reason,
        ]
    }
}

/// [`INSERT_MANY`]'s arrays: an earlier event's row, then the append's own.
#[derive(Default)]
struct EventColumns<'a> {
    run_id: Vec<&'a str>,
    n: Vec<i64>,
    kind: Vec<&'a str>,
    payload: Vec<String>,
    time_ms: Vec<i64>,
}

impl<'a> EventColumns<'a> {
    fn of(work: impl Iterator<Item = &'a (&'a EventAppend, &'a str)>) -> Self {
        let mut c = Self::default();
        for (a, payload) in work {
            let mut n = 0;
            if let Some(before) = &a.before {
                c.push(&a.id, n, &before.kind, before.payload.to_string(), a.now_ms);
                n += 1;
            }
            c.push(&a.id, n, &a.kind, (*payload).to_string(), a.now_ms);
        }
        c
    }

    fn push(&mut self, run_id: &'a str, n: i64, kind: &'a str, payload: String, time_ms: i64) {
        self.run_id.push(run_id);
        self.n.push(n);
        self.kind.push(kind);
        self.payload.push(payload);
        self.time_ms.push(time_ms);
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.run_id,
            &self.n,
            &self.kind,
            &self.payload,
            &self.time_ms,
        ]
    }
}
