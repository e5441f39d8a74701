//! The queue seam (R3, R9): claiming queued runs, requeueing after a retryable failure or
//! for a graceful stop, and the reaper's rescue of runs whose lease expired.
//!
//! Every transition is one guarded update whose affected-row count decides, re-checking
//! its condition inside the update (a heartbeat that lands first wins over the reaper).
//! The retry decision itself is the runtime's ([`crate::RetryPolicy::decide`]); the store
//! applies it.

use async_trait::async_trait;
use runwarden_base::StoreError;

use crate::retry::RetryDecision;
use crate::store::{Run, RunEvent, RunStore};

/// Why a run was failed for good; the retry policy decides it, and the queue applies it.
pub use crate::retry::DeadLetter;

/// Parameters of [`QueueStore::run_claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claiming segment.
    pub owner: String,
    /// The first lease.
    pub lease_until_ms: i64,
    /// Now; only runs whose next attempt is due (`retry_at_ms <= now`) are claimed.
    pub now_ms: i64,
    /// Only runs of these agents (the ones the worker can run); `None` for any agent.
    pub agents: Option<Vec<String>>,
    /// Record `run_started` ([`RunStarted::at_claim`](crate::events::RunStarted::at_claim))
    /// for each claimed run that has no events yet, in the claim's transaction. A store
    /// may leave it to the segment: [`Claimed::started`] says which.
    pub start: bool,
}

/// A claimed run and, when the store read them with the claim, its stored events.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The run, as the claim left it.
    pub run: Run,
    /// Every event of the run, oldest first, read after the claim committed; `None` when
    /// they were not read (the segment reads them itself).
    pub history: Option<Vec<RunEvent>>,
    /// The `run_started` event the claim recorded (not in `history`); `None` when it
    /// recorded none and the segment records its own start.
    pub started: Option<RunEvent>,
}

/// Parameters of [`QueueStore::run_requeue_apply`]: a decision the runtime took on the
/// run as it read it, and what it read, for the guard to re-check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequeueApply {
    /// The run.
    pub id: String,
    /// The segment that must hold the lease (R3).
    pub owner: String,
    /// The claim epoch the segment holds (its [`Run::claim_epoch`](crate::store::Run::claim_epoch) when claimed).
    pub epoch: i64,
    /// The `requeue_count` the decision read; the guard re-checks it.
    pub requeue_count: u32,
    /// The `pending_effect` the decision read; the guard re-checks it.
    pub pending_effect: Option<String>,
    /// What to do.
    pub decision: RetryDecision,
    /// The termination reason to store: why it was requeued, or for a dead letter the
    /// reason starting with its [`DeadLetter`] code.
    pub reason: String,
    /// A requeue that spends the budget raises `requeue_count` by one.
    pub counts: bool,
    /// Now.
    pub now_ms: i64,
}

/// What a requeue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequeueAnswer {
    /// Back in the queue; `requeue_count` is its new count.
    Requeued {
        /// The run's requeue count after this requeue.
        requeue_count: u32,
    },
    /// Failed for good instead, for this reason.
    DeadLettered(DeadLetter),
    /// A cancel won the row first.
    AlreadyCancelled,
    /// The segment no longer holds the lease.
    LeaseLost,
}

/// Parameters of [`QueueStore::run_rescue_apply`]: the reaper's decision about one stale
/// run, and what it read, for the guard to re-check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RescueApply {
    /// The run.
    pub id: String,
    /// The segment that held the lease when it was read (the guard re-checks it).
    pub owner: Option<String>,
    /// The `requeue_count` the decision read; a requeue raises it by one.
    pub requeue_count: u32,
    /// The `pending_effect` the decision read.
    pub pending_effect: Option<String>,
    /// What to do.
    pub decision: RetryDecision,
    /// The termination reason to store.
    pub reason: String,
    /// Now: the lease must still have expired before this instant.
    pub now_ms: i64,
}

/// What the reaper did with one stale run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescued {
    /// The run.
    pub id: String,
    /// Requeued or dead-lettered.
    pub action: RequeueAnswer,
}

/// Storage for the queue. Backends implement it with [`RunStore`]; every backend runs
/// `runwarden-storetest`'s queue checks.
///
/// The store decides nothing about retries: the runtime reads the run, decides with
/// [`RetryPolicy::decide`](crate::RetryPolicy::decide), and hands the store the decision to
/// apply with one guarded statement whose guard re-checks what the decision read, so a
/// race (a cancel, a heartbeat, another reaper) loses cleanly.
#[async_trait]
pub trait QueueStore: RunStore {
    /// R3: claims the oldest due queued run (of the claim's agents) with a guarded
    /// `queued -> running` update that sets the owner and lease and raises the claim
    /// epoch; exactly one claimant wins a run. `None` when none is due. A run is answered
    /// only once its claim's commit is confirmed (a commit whose outcome is unknown is
    /// re-read), so a segment never runs on a claim the store does not hold.
    async fn run_claim(&self, params: Claim) -> Result<Option<Run>, StoreError>;

    /// [`run_claim`](Self::run_claim) for up to `max` runs, oldest first, in as few trips
    /// to the store as it can: a worker with several free slots claims a run for each.
    /// Empty when none is due. A store that reads each run's events in the same trip
    /// answers them, so a segment starts without a second one; one that cannot answers
    /// `history: None`. This default claims one run at a time until one finds none; a
    /// failure after a claim answers the runs claimed so far (the next claim meets it
    /// again).
    async fn run_claim_many(&self, params: Claim, max: usize) -> Result<Vec<Claimed>, StoreError> {
        let mut claimed = Vec::new();
        while claimed.len() < max {
            match self.run_claim(params.clone()).await {
                Ok(Some(run)) => claimed.push(Claimed {
                    run,
                    history: None,
                    started: None,
                }),
                Ok(None) => break,
                Err(error) if claimed.is_empty() => return Err(error),
                Err(error) => {
                    tracing::warn!(%error, claimed = claimed.len(), "could not claim another run");
                    break;
                }
            }
        }
        Ok(claimed)
    }

    /// R9: applies a segment's decision to a running run held by `owner` with the
    /// `requeue_count` and `pending_effect` it read: back to the queue (owner and lease
    /// cleared, due at `retry_at_ms`) or failed for good (`pending_effect` kept). When the
    /// guard matches nothing: [`RequeueAnswer::AlreadyCancelled`] if a cancel won the row,
    /// [`RequeueAnswer::LeaseLost`] otherwise; nothing changes.
    async fn run_requeue_apply(&self, params: RequeueApply) -> Result<RequeueAnswer, StoreError>;

    /// R9: running runs whose lease expired before `now_ms`, oldest lease first, at most
    /// `limit`.
    async fn run_stale(&self, now_ms: i64, limit: u32) -> Result<Vec<Run>, StoreError>;

    /// R9: applies the reaper's decision to one run if it is still running, still stale
    /// at `now_ms`, and still held by the same owner with the same `requeue_count` and
    /// `pending_effect` (a heartbeat that lands first wins). A requeue raises
    /// `requeue_count` by one; a dead letter keeps `pending_effect`. False means skipped:
    /// the row changed since it was read, and nothing changed now.
    async fn run_rescue_apply(&self, params: RescueApply) -> Result<bool, StoreError>;

    /// R8: cancelled runs whose segment died before it recorded its stop (their lease
    /// ran out before `expired_before_ms`) get their final `run_stopped`, written with
    /// `reason`, unless their log has a final event already; either way their lease is
    /// cleared, so each cancelled run is looked at once. At most `limit` runs; answers
    /// the ids that got an event. The default does nothing.
    async fn run_stopped_orphans(
        &self,
        expired_before_ms: i64,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        let _ = (expired_before_ms, now_ms, limit);
        Ok(Vec::new())
    }

    /// Worker presence: records that worker `id` is alive at `now_ms` (its claim loop
    /// beats every [`WORKER_BEAT`](crate::WORKER_BEAT)), and forgets workers gone for a
    /// day. The default keeps nothing.
    async fn worker_seen(&self, id: &str, now_ms: i64) -> Result<(), StoreError> {
        let _ = (id, now_ms);
        Ok(())
    }

    /// When any worker was last seen, Unix milliseconds UTC; `None` when none ever was
    /// (or the store keeps no presence).
    async fn worker_last_seen(&self) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }

    /// Moves the ended runs' counts that a store keeps as one change per run into the
    /// counts [`run_counts`](RunStore::run_counts) reads, in bounded steps, and answers how
    /// many changes it moved. The reaper calls it each pass, so a store nobody scrapes for
    /// metrics does not keep a change for every run that ever ended. The default (a store
    /// that changes the counts in place) does nothing.
    async fn run_counts_fold(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

/// How long worker rows are kept after their last beat.
pub const WORKER_FORGOTTEN_AFTER_MS: i64 = 24 * 60 * 60 * 1000;
