//! The run store seam (R1, R3, R4, R7): runs, their events, and the guarded updates that
//! decide who may act on a run. Backends: `runwarden-store-sqlite`; every backend runs
//! `runwarden-storetest`'s run checks unchanged.
//!
//! Every write that could race is one guarded UPDATE whose affected-row count decides,
//! so a PostgreSQL backend can implement the same contract without SQLite-only tricks.

use async_trait::async_trait;
use runwarden_base::StoreError;
use serde_json::Value;

use crate::decision::{AnswerOutcome, Decision, DecisionAnswer, DecisionAsk, DecisionFilter};
use crate::feed::ChangeFeed;
use crate::state::RunState;

/// A run row (R1).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// A UUIDv7.
    pub id: String,
    /// The agent's name.
    pub agent: String,
    /// Where the run is.
    pub status: RunState,
    /// Why it ended (or was requeued), for people and for retry decisions.
    pub termination_reason: Option<String>,
    /// The stored request (agent input) of a queued run; dropped by a cancel.
    pub request: Option<Value>,
    /// The segment holding (or last holding) the lease.
    pub claimed_by: Option<String>,
    /// The fencing token of the latest claim: every claim raises it by one, and every
    /// guarded write of a segment checks it beside the owner, so a segment of an older
    /// claim writes nothing. 0 for a run never claimed.
    pub claim_epoch: i64,
    /// When the lease runs out, Unix milliseconds UTC.
    pub lease_expires_ms: Option<i64>,
    /// The effect of a write that started and was not recorded (R7).
    pub pending_effect: Option<String>,
    /// How often the run went back to the queue.
    pub requeue_count: u32,
    /// Model rounds so far.
    pub rounds: u32,
    /// Carried into audit rows of every outbound call.
    pub correlation: String,
    /// Unix milliseconds UTC.
    pub created_ms: i64,
    /// Unix milliseconds UTC.
    pub updated_ms: i64,
    /// Who started it, and the tags it was started with.
    pub origin: RunOrigin,
}

/// Who started a run and the tags it carries: what a policy may ask of the run besides
/// its agent. Set when the run is created, never changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOrigin {
    /// The API token (by name) or console user that started it; `None` for a run started
    /// on this machine's command line.
    pub started_by: Option<String>,
    /// The tags it was started with, checked by [`crate::rules::check_tags`].
    pub tags: Vec<String>,
}

/// One event of a run. `seq` is strictly increasing per run, never duplicated (R1).
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// The run.
    pub run_id: String,
    /// 1, 2, 3, ... per run.
    pub seq: i64,
    /// What happened (`model_response`, `tool_executed`, ...).
    pub kind: String,
    /// Details, as JSON.
    pub payload: Value,
    /// Unix milliseconds UTC.
    pub time_ms: i64,
}

/// How a new run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewRunStatus {
    /// A synchronous run: claimed by its segment at birth (R3).
    Running {
        /// The segment.
        owner: String,
        /// The first lease.
        lease_until_ms: i64,
    },
    /// A queued run, with its request stored.
    Queued,
}

/// Parameters of [`RunStore::run_create`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunCreate {
    /// A UUIDv7 chosen by the caller.
    pub id: String,
    /// The agent.
    pub agent: String,
    /// The correlation for audit rows (usually the id).
    pub correlation: String,
    /// The request to store (needed to requeue or claim the run later).
    pub request: Option<Value>,
    /// Running (claimed) or queued.
    pub status: NewRunStatus,
    /// Now, Unix milliseconds UTC.
    pub now_ms: i64,
    /// Who started it, and its tags.
    pub origin: RunOrigin,
}

/// Parameters of [`RunStore::run_create_keyed`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunCreateKeyed {
    /// The run to create when the key is new.
    pub run: RunCreate,
    /// Who sent the key (an API token's id, or `cli`): keys of different callers never
    /// collide.
    pub scope: String,
    /// The client's key.
    pub key: String,
    /// The hash of the request's canonical body: the same key with another body is refused.
    pub body_hash: String,
}

/// What a keyed create did.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyedCreate {
    /// The key was new (or expired): this run was created with it.
    Created(Run),
    /// The key was seen with the same body: the run it made then, as it is now.
    Existing(Run),
    /// The key was seen with another body; nothing was created.
    Reused {
        /// The run the key made.
        run_id: String,
    },
}

/// What a cancel did (R4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelAnswer {
    /// The run moved to `cancelled` from this state.
    Cancelled {
        /// The state it left.
        previous: RunState,
    },
    /// The run was already terminal; nothing changed.
    AlreadyTerminal(RunState),
    /// No run has that id.
    NotFound,
}

/// Parameters of [`RunStore::run_heartbeat`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The run.
    pub id: String,
    /// The segment that must hold the lease.
    pub owner: String,
    /// The claim epoch the segment holds (its [`Run::claim_epoch`] when claimed).
    pub epoch: i64,
    /// The renewed lease.
    pub lease_until_ms: i64,
    /// Now.
    pub now_ms: i64,
}

/// Parameters of [`RunStore::run_fence_mark`] (R7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceMark {
    /// The run.
    pub id: String,
    /// The segment that must hold the lease.
    pub owner: String,
    /// The claim epoch the segment holds (its [`Run::claim_epoch`] when claimed).
    pub epoch: i64,
    /// The effect about to happen (`non_idempotent_write`, `idempotent_write`).
    pub effect: String,
    /// The renewed lease.
    pub lease_until_ms: i64,
    /// Now.
    pub now_ms: i64,
}

/// Parameters of [`RunStore::run_event_append`].
#[derive(Debug, Clone, PartialEq)]
pub struct EventAppend {
    /// The run.
    pub id: String,
    /// The segment that must hold (or have held, for a cancelled run) the lease.
    pub owner: String,
    /// The claim epoch the segment holds (its [`Run::claim_epoch`] when claimed).
    pub epoch: i64,
    /// The event's kind.
    pub kind: String,
    /// The event's details.
    pub payload: Value,
    /// R7: clear `pending_effect` in the same update (a write step being recorded).
    pub clear_fence: bool,
    /// Raise the run's round count to this.
    pub round: Option<u32>,
    /// One truth per run: with a final event, the status change that ends the run, in the
    /// same transaction. The append then needs the run still `running` (a cancel that won
    /// the row refuses it, and the segment records its stop instead).
    pub end: Option<RunEnd>,
    /// Now.
    pub now_ms: i64,
    /// An event stored just before this one, under the same guard and in the same
    /// transaction: a final answer's model step with the run's end, so a run that answers
    /// ends in one write. The answer is this event's sequence number; `before` takes the
    /// one below it.
    pub before: Option<EarlierEvent>,
}

/// The event stored with an [`EventAppend`], just before it.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierEvent {
    /// The event's kind.
    pub kind: String,
    /// The event's details.
    pub payload: Value,
}

/// The row change that goes with a run's final event (see [`EventAppend::end`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// `Completed` or `Failed`.
    pub status: RunState,
    /// Why (the termination reason).
    pub reason: String,
}

/// Parameters of [`RunStore::run_settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSettle {
    /// The run.
    pub id: String,
    /// The segment that must hold the lease.
    pub owner: String,
    /// The claim epoch the segment holds (its [`Run::claim_epoch`] when claimed).
    pub epoch: i64,
    /// `Completed` or `Failed`.
    pub status: RunState,
    /// Why.
    pub reason: String,
    /// Now.
    pub now_ms: i64,
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleAnswer {
    /// The run is now terminal with the given status.
    Settled,
    /// A cancel won the row first; the run stays cancelled.
    AlreadyCancelled,
    /// The segment no longer holds the lease; nothing changed.
    LeaseLost,
}

/// The page size a store reads for a list request's `limit`: 0 means the default of 50,
/// and no page is larger than 1,000 (runs and decisions alike, on every backend).
pub fn page_limit(requested: u32) -> i64 {
    if requested == 0 {
        50
    } else {
        i64::from(requested.min(1_000))
    }
}

/// Which runs [`RunStore::run_list`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs in this status.
    pub status: Option<RunState>,
    /// Only runs of this agent.
    pub agent: Option<String>,
    /// Only runs older than this id (ids are UUIDv7, so id order is creation order): the
    /// cursor of the next page.
    pub before_id: Option<String>,
    /// At most this many (0 means 50).
    pub limit: u32,
}

/// Storage for runs and their events.
#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Inserts a run with its first event sequence free.
    async fn run_create(&self, params: RunCreate) -> Result<Run, StoreError>;

    /// Creates a run under a client's idempotency key, in one transaction: a new key (or
    /// one older than [`IDEMPOTENCY_RETENTION_MS`](crate::IDEMPOTENCY_RETENTION_MS)) is
    /// stored with the run; a known key answers the run it made if the body hash matches,
    /// and [`KeyedCreate::Reused`] if not. A unique (scope, key) makes racing requests
    /// create one run.
    ///
    /// The default refuses: a store that keeps no keys cannot promise one run per key.
    async fn run_create_keyed(&self, params: RunCreateKeyed) -> Result<KeyedCreate, StoreError> {
        let _ = params;
        Err(StoreError::new(
            "creating a run with an idempotency key",
            "this store keeps no idempotency keys: use the SQLite or PostgreSQL store",
        ))
    }

    /// One run.
    async fn run_get(&self, id: &str) -> Result<Option<Run>, StoreError>;

    /// R5, R6 (amended): the statuses of several runs in one query: the status watcher's
    /// batched refresh and the step-boundary probe (one id). Ids with no run are left out;
    /// the order is unspecified. It should not wait behind writers (SQLite answers from a
    /// WAL read connection of its own), since the first question of every call waits on it.
    async fn run_statuses(&self, ids: &[String]) -> Result<Vec<(String, RunState)>, StoreError>;

    /// O6: the store's change feed. Every write that commits publishes what it changed
    /// (an appended event, a new status, a queued run ready to claim) after the commit.
    fn change_feed(&self) -> &ChangeFeed;

    /// R4: a guarded transition from any non-terminal status to `cancelled` that drops the
    /// stored request; `pending_effect` is kept. A terminal run is refused. R12: the same
    /// transaction drops the run's pending decisions (the cancel wins).
    async fn run_cancel(&self, id: &str, now_ms: i64) -> Result<CancelAnswer, StoreError>;

    /// R3: renews the lease if `owner` holds it on a running (or just-cancelled) run;
    /// false means the lease was lost.
    async fn run_heartbeat(&self, params: Heartbeat) -> Result<bool, StoreError>;

    /// R7: stamps `pending_effect` and renews the lease, guarded by owner and `running`;
    /// false means the write must not happen.
    async fn run_fence_mark(&self, params: FenceMark) -> Result<bool, StoreError>;

    /// Appends an event with the next sequence number, guarded by owner and claim epoch
    /// (the run may be running or cancelled); with `clear_fence` the same transaction
    /// clears `pending_effect` (running runs only), and with `end` it moves a running run
    /// to its final status. `None` means the segment lost the run (or, with `end`, a
    /// cancel won it) and nothing was stored.
    async fn run_event_append(&self, params: EventAppend) -> Result<Option<i64>, StoreError>;

    /// Moves a running run held by `owner` to `completed` or `failed`.
    async fn run_settle(&self, params: RunSettle) -> Result<SettleAnswer, StoreError>;

    /// Runs matching a filter, newest first.
    async fn run_list(&self, filter: RunFilter) -> Result<Vec<Run>, StoreError>;

    /// How many runs are in each status (statuses with none are left out).
    async fn run_counts(&self) -> Result<Vec<(RunState, u64)>, StoreError>;

    /// Events with a sequence greater than `after_seq`, oldest first, at most `limit`
    /// (0 = all).
    async fn run_events(
        &self,
        id: &str,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<RunEvent>, StoreError>;

    /// R12: asks a decision, in one transaction guarded by `owner` holding the running
    /// run: appends the `decision_asked` event, inserts the pending decision and, for the
    /// kinds that park, moves the run to `waiting_for_approval` and releases its lease
    /// (the stored request and any write fence stay). `None` means the segment lost the
    /// run (a cancel, a lost lease) and nothing was stored.
    ///
    /// The default refuses: a store that keeps no decisions cannot park a run. Both
    /// backends implement it and run `storetest`'s decision checks.
    async fn decision_ask(&self, params: DecisionAsk) -> Result<Option<i64>, StoreError> {
        let _ = params;
        Err(no_decisions("asking a decision"))
    }

    /// R12: answers a decision with one guarded update: only a pending, unexpired
    /// decision whose run still waits (`waiting_for_approval` for the parking kinds,
    /// `running` for `input`) takes it, so two answers racing leave exactly one. The same
    /// transaction appends `decision_answered` to the run's log and, for the parking
    /// kinds, moves the run to `queued` (due now) or, for `cancel`, to `cancelled` (R4);
    /// an `effect_uncertain` answer also clears the write fence. An
    /// [`Answer::Expired`](crate::decision::Answer::Expired) is the runtime's expiry and
    /// is taken only once the decision is due.
    async fn decision_answer(&self, params: DecisionAnswer) -> Result<AnswerOutcome, StoreError> {
        let _ = params;
        Err(no_decisions("answering a decision"))
    }

    /// One decision.
    async fn decision_get(&self, id: &str) -> Result<Option<Decision>, StoreError> {
        let _ = id;
        Err(no_decisions("reading a decision"))
    }

    /// Decisions matching a filter, newest first.
    async fn decision_list(&self, filter: DecisionFilter) -> Result<Vec<Decision>, StoreError> {
        let _ = filter;
        Err(no_decisions("listing decisions"))
    }
}

fn no_decisions(what: &str) -> StoreError {
    StoreError::new(
        what,
        "this store keeps no operator decisions: use the SQLite or PostgreSQL store",
    )
}
