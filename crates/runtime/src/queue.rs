//! The queue seam (R3, R9): claiming queued runs, requeueing after a retryable failure or
//! for a graceful stop, and the reaper's rescue of runs whose lease expired.
//!
//! Every transition is one guarded update whose affected-row count decides, re-checking
//! its condition inside the update (a heartbeat that lands first wins over the reaper).

use async_trait::async_trait;
use runwarden_vault::store::StoreError;

use crate::store::{Run, RunStore};

/// Why a run was failed for good (R9). Written at the start of its termination reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetter {
    /// The failure will not heal on retry (4xx, auth, configuration, an unrecorded write),
    /// or the run has no stored request to retry from.
    NotRetryable,
    /// The requeue budget is spent.
    RetriesExhausted,
    /// A NON_IDEMPOTENT_WRITE was in flight: it may have run, so it is never retried.
    FencedWrite,
}

impl DeadLetter {
    /// The stable code that starts the termination reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotRetryable => "NOT_RETRYABLE",
            Self::RetriesExhausted => "RETRIES_EXHAUSTED",
            Self::FencedWrite => "FENCED_WRITE",
        }
    }
}

/// Parameters of [`QueueStore::run_claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claiming segment.
    pub owner: String,
    /// The first lease.
    pub lease_until_ms: i64,
    /// Now; only runs whose next attempt is due (`retry_at_ms <= now`) are claimed.
    pub now_ms: i64,
}

/// Parameters of [`QueueStore::run_requeue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    /// The run.
    pub id: String,
    /// The segment that must hold the lease.
    pub owner: String,
    /// Why (kept as the termination reason while queued).
    pub reason: String,
    /// When the next attempt may start.
    pub retry_at_ms: i64,
    /// True when this requeue spends the budget (a failure); false for a graceful stop.
    pub counts: bool,
    /// The budget: a counting requeue beyond it dead-letters instead (R9).
    pub max_requeues: u32,
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

/// Parameters of [`QueueStore::run_rescue_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescue {
    /// Runs whose lease expired before this instant are stale.
    pub now_ms: i64,
    /// The requeue budget (shared with retries of failures).
    pub max_requeues: u32,
    /// The first retry's delay; each requeue doubles it (no jitter: the store is
    /// deterministic).
    pub backoff_base_ms: i64,
    /// At most this many runs per call.
    pub limit: u32,
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
#[async_trait]
pub trait QueueStore: RunStore {
    /// R3: claims the oldest due queued run with a guarded `queued -> running` update that
    /// sets the owner and lease; exactly one claimant wins a run. `None` when none is due.
    async fn run_claim(&self, params: Claim) -> Result<Option<Run>, StoreError>;

    /// R9: puts a running run held by `owner` back in the queue (owner cleared). A
    /// counting requeue beyond the budget, a run without a stored request, or a run with a
    /// fenced NON_IDEMPOTENT_WRITE is dead-lettered instead (status failed, the reason
    /// starting with the [`DeadLetter`] code).
    async fn run_requeue(&self, params: Requeue) -> Result<RequeueAnswer, StoreError>;

    /// R9: every running run whose lease expired before `now_ms`, oldest lease first, is
    /// requeued (budget permitting, request stored, no fenced non-idempotent write) or
    /// dead-lettered. Staleness is re-checked inside each update.
    async fn run_rescue_many(&self, params: Rescue) -> Result<Vec<Rescued>, StoreError>;
}
