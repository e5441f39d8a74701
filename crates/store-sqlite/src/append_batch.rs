//! Group commit for run events: appends from segments running side by side share one
//! `BEGIN IMMEDIATE` transaction, each inside a savepoint of its own, so one append's guard
//! refusing it (a lost claim, a cancel that won the row) rolls back that append alone.
//!
//! The first append to find nobody draining starts a task that takes the queue in batches
//! until it is empty and answers every caller, itself included. The task, not a caller,
//! holds the answers: a caller that goes away cannot strand the others' (its own append
//! may still land, as a store call's blocking work always could).
//!
//! Every answer is as sure as a lone append's. An append answers only after the batch's
//! commit. If that commit's outcome is unknown, each append in the batch is re-read on its
//! own, as a lone append is. A single queued append takes the lone path unchanged.

use runwarden_base::StoreError;
use runwarden_runtime::Change;
use runwarden_runtime::store::EventAppend;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;

use crate::SqliteStore;
use crate::append_queue::{Answer, Pending};
use crate::cached::Cached;
use crate::failure::Failure;
use crate::publish::publish_status;

const APPENDING: &str = "appending a run event";

/// The most appends one transaction takes; the rest wait for the next.
const MAX_BATCH: usize = 64;

/// An append's answer inside the transaction, before the commit is known.
type Raw = Result<Option<i64>, Failure>;

impl SqliteStore {
    /// Appends one run event under its claim's guard, in a transaction shared with the
    /// appends queued beside it; `None` when the guard refused it.
    pub(crate) async fn append_event(&self, append: EventAppend) -> Answer {
        let (reply, answer) = oneshot::channel();
        let payload = append.payload.to_string();
        let start = {
            let mut queue = self.inner().appends.lock();
            queue.pending.push_back(Pending {
                append,
                payload,
                reply,
            });
            !std::mem::replace(&mut queue.draining, true)
        };
        if start {
            let store = self.clone();
            tokio::spawn(async move { store.drain_appends().await });
        }
        answer.await.map_err(|_| {
            StoreError::new(
                APPENDING,
                "the append was dropped unanswered (the process is shutting down); whether it was stored is unknown",
            )
        })?
    }

    /// Commits the queue in batches until it is empty.
    async fn drain_appends(&self) {
        let mut guard = Draining {
            store: self,
            done: false,
        };
        loop {
            let batch: Vec<Pending> = {
                let mut queue = self.inner().appends.lock();
                if queue.pending.is_empty() {
                    queue.draining = false;
                    guard.done = true;
                    return;
                }
                let take = queue.pending.len().min(MAX_BATCH);
                queue.pending.drain(..take).collect()
            };
            let (work, replies): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .map(|p| ((p.append, p.payload), p.reply))
                .unzip();
            let committed = self
                .run(APPENDING, move |conn| {
                    let answers = append_all(conn, &work);
                    Ok((work, answers))
                })
                .await;
            match committed {
                Ok((work, answers)) => {
                    for (((append, _), answer), reply) in work.iter().zip(answers).zip(replies) {
                        if let Ok(Some(seq)) = answer {
                            self.published(append, seq);
                        }
                        let _ = reply.send(answer);
                    }
                }
                Err(error) => {
                    for reply in replies {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
        }
    }

    /// Tells this process's live views about a stored event (and the run's end).
    fn published(&self, append: &EventAppend, seq: i64) {
        if let Some(end) = &append.end {
            publish_status(self.feed(), &append.id, end.status);
        }
        if append.before.is_some() {
            self.feed().publish(Change::Appended {
                run_id: append.id.clone(),
                seq: seq - 1,
            });
        }
        self.feed().publish(Change::Appended {
            run_id: append.id.clone(),
            seq,
        });
    }
}

/// Ends a drain that did not finish (its task panicked or its runtime stopped): the
/// appends still queued are answered with an error by their dropped senders, and the next
/// append starts a new drain.
struct Draining<'a> {
    store: &'a SqliteStore,
    done: bool,
}

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.store.inner().appends.lock();
            queue.pending.clear();
            queue.draining = false;
        }
    }
}

/// The batch's answers, in its order.
fn append_all(conn: &mut Connection, work: &[(EventAppend, String)]) -> Vec<Answer> {
    if let [(append, payload)] = work {
        return vec![append_alone(conn, append, payload)];
    }
    let (answers, ended) = in_one_transaction(conn, work);
    work.iter()
        .zip(answers)
        .map(|((append, payload), answer)| {
            let answer = match (&ended, answer) {
                // Refused by its guard: nothing of it was to be stored, whatever the commit.
                (_, Ok(None)) => Ok(None),
                (Ok(()), answer) => answer,
                // The commit (or the start) failed: stored only if a re-read finds it.
                (Err(failed), _) => Err(Failure::Store(failed.clone())),
            };
            confirmed(conn, append, payload, answer).map_err(|f| f.into_store_error(APPENDING))
        })
        .collect()
}

/// One append in a transaction of its own, its commit confirmed.
fn append_alone(conn: &mut Connection, append: &EventAppend, payload: &str) -> Answer {
    let appended = append_guarded(conn, append, payload);
    confirmed(conn, append, payload, appended).map_err(|f| f.into_store_error(APPENDING))
}

/// `appended`, or, when its commit's outcome is unknown, what the log holds: read as
/// unstored, a recorded write would end FENCED_WRITE. The same kind, payload and time is
/// this append.
fn confirmed(conn: &Connection, append: &EventAppend, payload: &str, appended: Raw) -> Raw {
    crate::confirm::or_reread(conn, APPENDING, appended, |conn| {
        let seq = conn
            .query_row_cached(
                "SELECT seq FROM run_events
                 WHERE run_id = ?1 AND kind = ?2 AND time_ms = ?3 AND payload = ?4
                 ORDER BY seq DESC LIMIT 1",
                params![append.id, append.kind, append.now_ms, payload],
                |row| row.get(0),
            )
            .optional()?;
        Ok(seq.map(Some))
    })
}

/// Every append of the batch in one transaction, each in a savepoint: a refused or failed
/// append is rolled back alone. The second value is how the transaction ended: `Err` when
/// it could not start or commit (then no answer's `Some` is sure).
fn in_one_transaction(
    conn: &mut Connection,
    work: &[(EventAppend, String)],
) -> (Vec<Raw>, Result<(), StoreError>) {
    let failed = |failure: Failure| failure.into_store_error(APPENDING);
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let error = failed(e.into());
            let answers = work.iter().map(|_| Err(Failure::Store(error.clone())));
            return (answers.collect(), Err(error));
        }
    };
    let mut answers = Vec::with_capacity(work.len());
    for (append, payload) in work {
        let answer = match tx.savepoint() {
            Ok(mut savepoint) => {
                let answer = guarded_steps(&savepoint, append, payload);
                let ended = match answer {
                    Ok(Some(_)) => savepoint.commit(),
                    Ok(None) | Err(_) => savepoint.rollback(),
                };
                match ended {
                    Ok(()) => answer,
                    // A savepoint that cannot end leaves the transaction in doubt.
                    Err(e) => return doubt(answers, work.len(), failed(e.into())),
                }
            }
            Err(e) => return doubt(answers, work.len(), failed(e.into())),
        };
        answers.push(answer);
    }
    let ended = tx.commit().map_err(|e| failed(e.into()));
    (answers, ended)
}

/// A transaction that could not go on: `answers` made as long as the batch (the missing
/// ones failed with `error`), and `error` as how it ended (it is rolled back when dropped).
fn doubt(
    mut answers: Vec<Raw>,
    len: usize,
    error: StoreError,
) -> (Vec<Raw>, Result<(), StoreError>) {
    answers.resize_with(len, || Err(Failure::Store(error.clone())));
    (answers, Err(error))
}

/// One append in a transaction of its own (R1): the guard, the next sequence number and
/// the event, committed together; `None` when the guard refused it.
fn append_guarded(
    conn: &mut Connection,
    append: &EventAppend,
    payload: &str,
) -> Result<Option<i64>, Failure> {
    // BEGIN IMMEDIATE takes the write lock before reading MAX(seq), so a writer in
    // another process waits (busy timeout) instead of taking the same sequence (R1).
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let seq = guarded_steps(&tx, append, payload)?;
    if seq.is_some() {
        tx.commit()?;
    }
    // Otherwise dropping the transaction rolls it back: nothing is stored.
    Ok(seq)
}

/// The statements of one append, inside a transaction or savepoint the caller ends.
fn guarded_steps(
    conn: &Connection,
    append: &EventAppend,
    payload: &str,
) -> Result<Option<i64>, Failure> {
    let round = append.round.map(i64::from);
    // The guard decides: the owner of a running run under this claim's epoch, or of a run
    // cancelled under it (R5: it records its boundary step). R7: the fence is cleared on a
    // running run only; a cancelled mid-write run keeps its mark. Rounds never go down. A
    // final event with `end` moves a running run to its final status in the same
    // transaction (one truth per run); a cancel that won the row refuses it.
    let (end_status, end_reason) = match &append.end {
        Some(end) => (Some(end.status.as_str()), Some(end.reason.as_str())),
        None => (None, None),
    };
    let changed = conn.execute_cached(
        "UPDATE runs SET
         pending_effect = CASE WHEN ?1 AND status = 'running' THEN NULL
                               ELSE pending_effect END,
         rounds = MAX(rounds, COALESCE(?2, rounds)),
         termination_reason = CASE WHEN ?7 IS NULL THEN termination_reason
                                   ELSE ?8 END,
         status = COALESCE(?7, status),
         updated_ms = ?3
     WHERE id = ?4 AND claimed_by = ?5 AND claim_epoch = ?6
       AND (status = 'running' OR (?7 IS NULL AND status = 'cancelled'))",
        params![
            append.clear_fence,
            round,
            append.now_ms,
            append.id,
            append.owner,
            append.epoch,
            end_status,
            end_reason
        ],
    )?;
    if changed != 1 {
        return Ok(None);
    }
    let mut seq: i64 = conn.query_row_cached(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = ?1",
        [&append.id],
        |row| row.get(0),
    )?;
    let insert = "INSERT INTO run_events (run_id, seq, kind, payload, time_ms)
     VALUES (?1, ?2, ?3, ?4, ?5)";
    if let Some(before) = &append.before {
        let earlier = before.payload.to_string();
        conn.execute_cached(
            insert,
            params![append.id, seq, before.kind, earlier, append.now_ms],
        )?;
        seq += 1;
    }
    conn.execute_cached(
        insert,
        params![append.id, seq, append.kind, payload, append.now_ms],
    )?;
    Ok(Some(seq))
}
