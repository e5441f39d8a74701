//! Group commit for the audit log: concurrent appends share one store transaction, and
//! each committed batch moves the anchor file outside the database (V7 amended).
//!
//! There is no background task (vaults live in many short-lived runtimes). A caller
//! enqueues its event; if no flush is running it becomes the leader, takes everything
//! queued, commits it as one batch, answers every caller in the batch, advances the
//! anchor, and hands leadership to the first caller still waiting. Followers await their
//! answer. Every caller returns only after its row is committed; a failed batch fails
//! every caller in it.
//!
//! The anchor is written after the followers are answered (their rows are durable in the
//! database already), while the next batch commits, so it trails the log by at most the
//! two batches in flight. An outbound call's intent leaves the anchor write to its caller,
//! who does it while its request goes out. An anchor write that fails is retried before a
//! later batch commits; if the retry fails too, that batch is refused: the log never runs
//! ahead of its witness by more than two batches.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::audit::{AuditChain, AuditEvent, AuditRow};
use crate::error::VaultError;
use crate::external_witness::ExternalWitness;
use crate::own_rows::OwnRows;
use crate::store::{AuditFilter, StoreError, VaultStore};
use crate::witness::{Advanced, Anchored, Witness, WitnessError};

/// The most rows one transaction takes; the rest wait for the next leader.
const MAX_BATCH: usize = 512;

/// How often a leader re-reads an anchor another process moved before it gives up for
/// this batch (the other process's anchor is then the newer witness anyway).
const ANCHOR_ATTEMPTS: usize = 4;

/// What a waiting caller is told.
enum Reply {
    /// Its row was committed, or its batch failed.
    Written(Box<Result<AuditRow, BatchFailure>>),
    /// It is the leader now: its event is still queued and it flushes the queue.
    Lead,
}

/// Why a batch failed, shared by every caller in it.
#[derive(Debug, Clone)]
enum BatchFailure {
    Store(StoreError),
    /// The anchor file lags since an earlier batch and still cannot be advanced; nothing
    /// of this batch was written.
    Witness(String),
}

impl BatchFailure {
    fn into_error(self) -> VaultError {
        match self {
            Self::Store(e) => VaultError::Store(e),
            Self::Witness(problem) => VaultError::AuditAnchor { problem },
        }
    }
}

struct Pending {
    ticket: u64,
    event: AuditEvent,
    /// `None` for the leader's own event (it learns its row from the flush).
    reply: Option<oneshot::Sender<Reply>>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    leading: bool,
    next_ticket: u64,
}

/// Appends audit rows in batches and keeps the anchor file in step.
pub(crate) struct AuditWriter {
    store: Arc<dyn VaultStore>,
    chain: Arc<AuditChain>,
    witness: Option<Witness>,
    /// Where every advance of the anchor is appended too, when configured.
    external: Option<ExternalWitness>,
    /// The vault made the audit key in this open: a missing anchor may be created with
    /// the first row. Otherwise a missing anchor is lost evidence and is never recreated.
    fresh_key: bool,
    /// The anchor as this process last read or wrote it: a hint, checked under the file's
    /// lock before every write.
    anchored: Mutex<Option<Anchored>>,
    warned_missing: AtomicBool,
    /// The rows of a batch whose anchor write failed, until a retry succeeds.
    behind: Mutex<Option<Vec<AuditRow>>>,
    /// The rows this process committed since the anchor, while no other process wrote
    /// between them: they show a batch extends the anchor without reading the log.
    own_rows: Mutex<OwnRows>,
    /// Held while writing the anchor file; taken in batch order (tokio's mutex is fair).
    anchor_turn: tokio::sync::Mutex<()>,
    queue: Mutex<Queue>,
}

impl AuditWriter {
    pub(crate) fn new(store: Arc<dyn VaultStore>, chain: Arc<AuditChain>, fresh_key: bool) -> Self {
        Self {
            store,
            chain,
            witness: None,
            external: None,
            fresh_key,
            anchored: Mutex::new(None),
            warned_missing: AtomicBool::new(false),
            behind: Mutex::new(None),
            own_rows: Mutex::new(OwnRows::default()),
            anchor_turn: tokio::sync::Mutex::new(()),
            queue: Mutex::new(Queue::default()),
        }
    }

    pub(crate) fn set_witness(&mut self, witness: Witness) {
        self.witness = Some(witness);
        *lock(&self.anchored) = None;
    }

    pub(crate) fn witness(&self) -> Option<&Witness> {
        self.witness.as_ref()
    }

    pub(crate) fn set_external(&mut self, external: ExternalWitness) {
        self.external = Some(external);
    }

    pub(crate) fn external(&self) -> Option<&ExternalWitness> {
        self.external.as_ref()
    }

    /// Appends a new anchor to the external witness. A failure is logged, not returned:
    /// the witness may live on a mount that comes and goes, and it only ever proves a
    /// lower bound, so a missed line weakens it without making it lie.
    pub(crate) async fn witness_external(&self, anchored: Anchored) {
        let Some(external) = self.external.clone() else {
            return;
        };
        let chain = self.chain.clone();
        let path = external.path().display().to_string();
        let appended = tokio::task::spawn_blocking(move || external.append(&chain, anchored)).await;
        match appended {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(path, %error, "could not append to the audit log's external witness");
            }
            Err(error) => {
                tracing::error!(path, %error, "the external witness task failed");
            }
        }
    }

    /// Appends one row; answers once it is committed and anchored.
    pub(crate) async fn append(&self, event: AuditEvent) -> Result<AuditRow, VaultError> {
        let (row, due) = self.append_then_anchor(event).await?;
        if let Some(due) = due {
            due.write().await;
        }
        Ok(row)
    }

    /// Appends one row; answers once it is committed, with the anchor write the caller
    /// still owes when it led a synced batch. The caller may do other work while it
    /// writes the anchor (an outbound call sends its request meanwhile); the next batch
    /// commits in the meantime and the one after waits for the anchor, as with
    /// [`append`](Self::append). An [`AnchorDue`] dropped unwritten is written before the
    /// next batch commits.
    pub(crate) async fn append_then_anchor(
        &self,
        event: AuditEvent,
    ) -> Result<(AuditRow, Option<AnchorDue<'_>>), VaultError> {
        let (tx, rx) = oneshot::channel();
        let (ticket, leader) = {
            let mut queue = lock(&self.queue);
            let ticket = queue.next_ticket;
            queue.next_ticket += 1;
            let leader = !queue.leading;
            queue.leading = true;
            queue.pending.push_back(Pending {
                ticket,
                event,
                reply: (!leader).then_some(tx),
            });
            (ticket, leader)
        };
        if !leader {
            let mut waiter = Waiter {
                writer: self,
                ticket,
                rx: Some(rx),
            };
            let rx = waiter.rx.as_mut().expect("set above");
            match rx.await {
                Ok(Reply::Written(result)) => {
                    waiter.rx = None;
                    return (*result)
                        .map(|row| (row, None))
                        .map_err(BatchFailure::into_error);
                }
                Ok(Reply::Lead) => waiter.rx = None,
                Err(_) => {
                    // The leader holding our event was dropped mid-flush.
                    waiter.rx = None;
                    return Err(VaultError::AuditInterrupted);
                }
            }
        }
        let mut guard = Leadership {
            writer: self,
            held: true,
        };
        let result = self.lead(ticket, &mut guard).await;
        guard.release();
        result
    }

    /// Flushes one batch holding the leader's own event and answers everyone in it; with
    /// the anchor write it owes when the batch was synced.
    async fn lead(
        &self,
        ticket: u64,
        leadership: &mut Leadership<'_>,
    ) -> Result<(AuditRow, Option<AnchorDue<'_>>), VaultError> {
        let batch: Vec<Pending> = {
            let mut queue = lock(&self.queue);
            let take = queue.pending.len().min(MAX_BATCH);
            let mut batch: Vec<Pending> = queue.pending.drain(..take).collect();
            // The leader's event is always in its first batch: it was queued before it was
            // promoted, and nothing is taken between the promotion and here. Should it sit
            // beyond MAX_BATCH, move it in so this flush answers its own caller.
            if !batch.iter().any(|p| p.ticket == ticket)
                && let Some(at) = queue.pending.iter().position(|p| p.ticket == ticket)
                && let Some(own) = queue.pending.remove(at)
            {
                batch.push(own);
            }
            batch
        };
        // Only a batch the store synced moves the anchor: it then names rows on disk (the
        // sync covers the outcome rows committed before it too), so a power cut can make
        // the anchor lag the log but never lead it.
        let synced = batch.iter().any(|p| p.event.must_sync());
        let mut events = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for p in batch {
            events.push(p.event);
            replies.push((p.ticket, p.reply));
        }
        let outcome = self.commit(events).await;
        let mut own = Err(VaultError::AuditInterrupted);
        for (i, (t, reply)) in replies.into_iter().enumerate() {
            let result = match &outcome {
                Ok(rows) => Ok(rows[i].clone()),
                Err(failure) => Err(failure.clone()),
            };
            match reply {
                Some(reply) => {
                    // A caller that went away no longer needs its answer.
                    let _ = reply.send(Reply::Written(Box::new(result)));
                }
                None if t == ticket => own = result.map_err(BatchFailure::into_error),
                None => {}
            }
        }
        // The followers go on. The anchor follows: this leader takes its turn at the anchor
        // file before handing on leadership, so anchors are written in batch order, and
        // the next batch commits while this one's anchor is being written.
        let due = match outcome {
            Ok(rows) if self.witness.is_some() && synced => {
                let turn = self.anchor_turn.lock().await;
                leadership.release();
                Some(AnchorDue {
                    writer: self,
                    rows: Some(rows),
                    _turn: turn,
                })
            }
            _ => None,
        };
        match own {
            Ok(row) => Ok((row, due)),
            Err(error) => {
                if let Some(due) = due {
                    due.write().await;
                }
                Err(error)
            }
        }
    }

    /// Commits the events as one batch, once the anchor has caught up with the last one.
    async fn commit(&self, events: Vec<AuditEvent>) -> Result<Vec<AuditRow>, BatchFailure> {
        let behind = lock(&self.behind).take();
        if let Some(rows) = behind
            && let Err(problem) = {
                let _turn = self.anchor_turn.lock().await;
                self.advance_anchor(&rows).await
            }
        {
            // V7 (amended): a witness that cannot keep up refuses further rows (and so
            // further calls) rather than let the log run ahead of it unwitnessed.
            *lock(&self.behind) = Some(rows);
            return Err(BatchFailure::Witness(problem));
        }
        let rows = self
            .store
            .audit_append_many(events, self.chain.clone())
            .await
            .map_err(BatchFailure::Store)?;
        if self.witness.is_some() {
            lock(&self.own_rows).remember(&rows);
        }
        Ok(rows)
    }

    /// Moves the anchor file to the end of `rows` (monotonic), after checking that the
    /// rows extend the chain the anchor records (a rolled-back log never moves it).
    async fn advance_anchor(&self, rows: &[AuditRow]) -> Result<(), String> {
        let (Some(witness), Some(first), Some(last)) = (&self.witness, rows.first(), rows.last())
        else {
            return Ok(());
        };
        let next = Anchored {
            length: last.id,
            hash: last.hash,
        };
        let mut expected = *lock(&self.anchored);
        for _ in 0..ANCHOR_ATTEMPTS {
            let current = match expected {
                Some(current) => current,
                None => match self.blocking(witness, |w, c| w.read(c)).await? {
                    Some(current) => current,
                    None if first.id == 1 && self.fresh_key => {
                        // A fresh log of a key made by this open: the anchor starts with it.
                        if self
                            .blocking(witness, move |w, c| w.create(c, next))
                            .await?
                        {
                            self.anchored_at(next);
                            self.witness_external(next).await;
                            return Ok(());
                        }
                        expected = None;
                        continue;
                    }
                    None => {
                        if !self.warned_missing.swap(true, Ordering::Relaxed) {
                            tracing::warn!(path = %witness.path().display(), "the audit anchor file is missing, so rows are written unwitnessed: restore it from a backup, or, for an installation that predates anchor files, run `runwarden audit verify --adopt-anchor`");
                        }
                        return Ok(());
                    }
                },
            };
            if current.length >= next.length {
                if current.length > last.id {
                    tracing::error!(path = %witness.path().display(), anchored = current.length, tip = last.id, "the audit log ends before the row its anchor records: it was wiped or rolled back; the anchor is kept");
                }
                self.anchored_at(current);
                return Ok(());
            }
            if !self.extends(rows, current).await? {
                tracing::error!(path = %witness.path().display(), anchored = current.length, "the audit log does not extend the anchored tip: it was rolled back or replaced; the anchor is kept as evidence");
                return Ok(());
            }
            match self
                .blocking(witness, move |w, c| w.advance(c, current, next))
                .await?
            {
                Advanced::Written => {
                    self.anchored_at(next);
                    self.witness_external(next).await;
                    return Ok(());
                }
                Advanced::AlreadyAhead(ahead) => {
                    self.anchored_at(ahead);
                    return Ok(());
                }
                Advanced::Moved(moved) => expected = moved,
            }
        }
        Ok(())
    }

    /// Records where the anchor now stands; the rows before it need no linking again.
    fn anchored_at(&self, anchored: Anchored) {
        *lock(&self.anchored) = Some(anchored);
        lock(&self.own_rows).forget_before(anchored.length);
    }

    /// True when the row the anchor names is in the log with the anchored hash.
    async fn extends(&self, rows: &[AuditRow], anchored: Anchored) -> Result<bool, String> {
        let first = &rows[0];
        if anchored.length == 0 {
            return Ok(true);
        }
        if anchored.length == first.id - 1 {
            return Ok(first.prev_hash == anchored.hash);
        }
        if let Some(row) = rows.iter().find(|r| r.id == anchored.length) {
            return Ok(row.hash == anchored.hash);
        }
        if lock(&self.own_rows).link(anchored, first) {
            return Ok(true);
        }
        // Another process appended between the anchor and this batch: read that row.
        let filter = AuditFilter {
            after_id: Some(anchored.length - 1),
            limit: 1,
            ..AuditFilter::default()
        };
        let found = self
            .store
            .audit_list(filter)
            .await
            .map_err(|e| e.to_string())?;
        Ok(found
            .first()
            .is_some_and(|r| r.id == anchored.length && r.hash == anchored.hash))
    }

    async fn blocking<T: Send + 'static>(
        &self,
        witness: &Witness,
        work: impl FnOnce(&Witness, &AuditChain) -> Result<T, WitnessError> + Send + 'static,
    ) -> Result<T, String> {
        let (witness, chain) = (witness.clone(), self.chain.clone());
        tokio::task::spawn_blocking(move || work(&witness, &chain))
            .await
            .map_err(|e| format!("the anchor task failed: {e}"))?
            .map_err(|e| e.to_string())
    }

    /// Ends a leadership: hands it to the first caller still waiting, or clears it.
    fn release(&self) {
        let mut queue = lock(&self.queue);
        loop {
            let Some(next) = queue
                .pending
                .iter_mut()
                .find(|p| p.reply.as_ref().is_some_and(|r| !r.is_closed()))
            else {
                // Nobody left who can lead: drop the events of callers that went away (they
                // no longer wait for a row) and stop leading.
                queue.pending.retain(|p| p.reply.is_some());
                queue.leading = false;
                return;
            };
            let reply = next.reply.take().expect("found with a reply");
            if reply.send(Reply::Lead).is_ok() {
                return;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The queue holds no invariant a panic could break halfway (every update is one
    // statement), so a poisoned lock is still usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A follower's wait. Dropped early (its caller went away), it takes its event out of
/// the queue and passes on a leadership it was handed but never took up.
struct Waiter<'a> {
    writer: &'a AuditWriter,
    ticket: u64,
    rx: Option<oneshot::Receiver<Reply>>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let handed_lead = matches!(rx.try_recv(), Ok(Reply::Lead));
        {
            let mut queue = lock(&self.writer.queue);
            queue.pending.retain(|p| p.ticket != self.ticket);
        }
        if handed_lead {
            self.writer.release();
        }
    }
}

/// The anchor write a leader owes for its synced batch, holding the turn at the anchor
/// file so anchors are written in batch order. Dropped unwritten (its caller went away),
/// it leaves the rows to the next batch, which writes their anchor before it commits.
pub(crate) struct AnchorDue<'a> {
    writer: &'a AuditWriter,
    rows: Option<Vec<AuditRow>>,
    _turn: tokio::sync::MutexGuard<'a, ()>,
}

impl AnchorDue<'_> {
    /// Moves the anchor to the batch's last row. A failure is logged and retried before
    /// the next batch commits, which is refused if the retry fails too.
    pub(crate) async fn write(mut self) {
        let Some(rows) = self.rows.take() else {
            return;
        };
        if let Err(problem) = self.writer.advance_anchor(&rows).await {
            tracing::error!(%problem, "the audit rows were committed but the anchor file could not record them; retrying before the next batch");
            *lock(&self.writer.behind) = Some(rows);
        }
    }
}

impl Drop for AnchorDue<'_> {
    fn drop(&mut self) {
        if let Some(rows) = self.rows.take() {
            // Unwritten, or cut off mid-write (a rewrite of the same anchor is harmless).
            let mut behind = lock(&self.writer.behind);
            match behind.as_mut() {
                Some(earlier) => earlier.extend(rows),
                None => *behind = Some(rows),
            }
        }
    }
}

/// The leader's hold on the queue; released on every path, a dropped future included.
struct Leadership<'a> {
    writer: &'a AuditWriter,
    held: bool,
}

impl Leadership<'_> {
    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.writer.release();
        }
    }
}

impl Drop for Leadership<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
