//! The executor: creates runs, cancels them, and executes a segment of a run it holds.
//!
//! A segment walks the step loop (`step_loop.rs`): a model step (`model_step.rs`), the
//! tool steps it asked for (`tool_step.rs`), the next round; a step that needs a person
//! asks for a decision (`decision_step.rs`). Around the steps: the lease and the signal
//! every call carries (`lease.rs`), the budgets (`spending.rs`), the limits a call takes
//! before it leaves (`limit_step.rs`), the write fence (`fence.rs`), recording each step
//! (`record.rs`), how a segment ends (`ending.rs`), and the run's state rebuilt from its
//! log on resume (`replay.rs`).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runwarden_base::StoreError;
use serde_json::{Value, json};
use tracing::Instrument as _;

use crate::agent::AgentSpec;
use crate::budget::{BudgetStop, Budgets};
use crate::events::DecisionAnswered;
use crate::observer::Observer;
use crate::progress::PROGRESS_INTERVAL;
use crate::queue::QueueStore;
use crate::retry::RetryPolicy;
use crate::signal::CancelHub;
use crate::state::Outcome;
use crate::store::{CancelAnswer, NewRunStatus, Run, RunCreate, RunEvent, RunOrigin, RunStore};
use crate::time::{ms, now_ms};
use crate::watcher::StatusWatcher;

mod decision_step;
mod ending;
mod fence;
mod gateway;
mod gateway_approval;
mod lease;
mod limit_step;
mod model_step;
mod policy_step;
mod record;
mod replay;
mod spending;
mod step_loop;
mod store_refused;
mod tool_step;

/// The default lease of an executing segment (R3).
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default interval of the background heartbeat.
pub(crate) const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// Who executes and how long a lease lasts.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// This segment's identity (`claimed_by`), unique per process.
    pub owner: String,
    /// How long a lease lasts without renewal.
    pub lease: Duration,
    /// How often the background heartbeat renews it.
    pub heartbeat: Duration,
    /// The least time between two progress events of one call (L6, M15).
    pub progress_interval: Duration,
    /// O5: put each tool call's arguments, as the model produced them, on its `tool_call`
    /// span as `arguments`. Off by default: arguments may hold personal data.
    pub record_arguments: bool,
}

impl ExecutorConfig {
    /// A config with a fresh owner name and the default lease and heartbeat.
    pub fn new(owner_prefix: &str) -> Self {
        Self {
            owner: format!(
                "{owner_prefix}-{}-{}",
                std::process::id(),
                uuid::Uuid::now_v7()
            ),
            lease: DEFAULT_LEASE,
            heartbeat: DEFAULT_HEARTBEAT,
            progress_interval: PROGRESS_INTERVAL,
            record_arguments: false,
        }
    }
}

/// Sees how long a cancelled call took to come back after the [`CancelHub`] woke it: from
/// the wake-up of a cancel issued in this process to the call returning cancelled (the
/// API server feeds its cancel-latency histogram with it).
pub type CancelLatencyObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// Runs agents. One per process; cheap to share.
pub struct Executor {
    store: Arc<dyn RunStore>,
    /// The same store as a queue, for segments of queued runs.
    queue: Option<Arc<dyn QueueStore>>,
    /// The process's status watcher (R6 amended), shared by every executor in it.
    watcher: StatusWatcher,
    hub: Arc<CancelHub>,
    config: ExecutorConfig,
    cancel_latency: Option<CancelLatencyObserver>,
    /// R14: the limits on its calls; `None`: no limits, nothing read.
    limiter: Option<Arc<crate::limits::Limiter>>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Stops a background task of the segment (the heartbeat, the wall-clock budget timer)
/// when the segment ends, however it ends.
struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a run has spent of its budgets (R13), from its log and this segment's steps.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    output_tokens: u64,
    tool_calls: u32,
}

/// One executing segment's context.
struct Segment<'a> {
    run: &'a Run,
    agent: &'a AgentSpec,
    observer: Option<Observer>,
    lease_lost: Arc<AtomicBool>,
    options: &'a SegmentOptions,
    /// The budgets in force: the agent's, lowered by the run's request (R13).
    budgets: Budgets,
    /// Set when a budget runs out; every call's signal carries it (R13).
    budget: Arc<BudgetStop>,
    spent: Mutex<Spent>,
    /// R12: the answered approvals of the log, by the model's call id.
    approvals: Mutex<HashMap<String, DecisionAnswered>>,
    /// R8: set once this segment stored a final event (`run_completed`, `run_failed`):
    /// a cancel that then wins the row gets no second one.
    ended: AtomicBool,
    /// M19: answered `input` decisions of calls to re-issue, by the model's call id
    /// (the decision's id; taken once the call is re-issued).
    inputs: Mutex<HashMap<String, String>>,
}

/// How a segment of a queued run behaves beyond a synchronous one.
#[derive(Debug, Clone, Default)]
pub struct SegmentOptions {
    /// Retry retryable failures by requeueing (R9); without it a failure settles the run.
    pub retry: Option<RetryPolicy>,
    /// When set, the segment puts its run back in the queue at its next boundary (a
    /// graceful worker stop); the requeue does not spend the retry budget.
    pub drain: Option<Arc<AtomicBool>>,
    /// The run's events, when the claim read them; `None` reads them at the start.
    pub history: Option<Vec<RunEvent>>,
    /// The `run_started` the claim recorded; the segment then records no start of its
    /// own.
    pub started: Option<RunEvent>,
}

impl Executor {
    /// An executor over a store, with the process's status watcher (and through it the
    /// process's cancel hub).
    pub fn new(store: Arc<dyn RunStore>, watcher: StatusWatcher, config: ExecutorConfig) -> Self {
        Self {
            store,
            queue: None,
            hub: watcher.hub().clone(),
            watcher,
            config,
            cancel_latency: None,
            limiter: None,
        }
    }

    /// An executor over a store that is also a queue (workers use this one).
    pub fn with_queue(
        queue: Arc<dyn QueueStore>,
        watcher: StatusWatcher,
        config: ExecutorConfig,
    ) -> Self {
        let store: Arc<dyn RunStore> = queue.clone();
        Self {
            store,
            queue: Some(queue),
            hub: watcher.hub().clone(),
            watcher,
            config,
            cancel_latency: None,
            limiter: None,
        }
    }

    /// The process's status watcher.
    pub fn watcher(&self) -> &StatusWatcher {
        &self.watcher
    }

    /// Reports the latency of every in-process cancel that stopped a call in flight.
    pub fn with_cancel_latency(mut self, observer: CancelLatencyObserver) -> Self {
        self.cancel_latency = Some(observer);
        self
    }

    /// The store behind this executor.
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.store
    }

    /// The lease length in milliseconds.
    pub fn lease_ms(&self) -> i64 {
        ms(self.config.lease)
    }

    /// This segment's identity.
    pub fn owner(&self) -> &str {
        &self.config.owner
    }

    /// R3: a synchronous run claims its row at birth.
    pub async fn create_sync(&self, agent: &str, prompt: &str) -> Result<Run, StoreError> {
        self.create_sync_with(agent, prompt, &Budgets::default(), RunOrigin::default())
            .await
    }

    /// [`create_sync`](Self::create_sync) with the run's own budgets (R13), stored with its
    /// request, and who started it with which tags; the caller checked the budgets against
    /// the agent's and the tags with [`crate::rules::check_tags`].
    pub async fn create_sync_with(
        &self,
        agent: &str,
        prompt: &str,
        budgets: &Budgets,
        origin: RunOrigin,
    ) -> Result<Run, StoreError> {
        let request = Some(run_request(prompt, budgets));
        self.create_running(agent, request, origin).await
    }

    /// A new run held by this executor from birth, with `request` stored (or none).
    pub(crate) async fn create_running(
        &self,
        agent: &str,
        request: Option<Value>,
        origin: RunOrigin,
    ) -> Result<Run, StoreError> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_ms();
        self.store
            .run_create(RunCreate {
                id: id.clone(),
                agent: agent.to_string(),
                correlation: id,
                request,
                status: NewRunStatus::Running {
                    owner: self.config.owner.clone(),
                    lease_until_ms: now + ms(self.config.lease),
                },
                now_ms: now,
                origin,
            })
            .await
    }

    /// R4: the operator's cancel, as issued through this process: the guarded row update,
    /// then a wake-up for the run's in-flight signals so they ask at once (R6).
    pub async fn cancel(&self, run_id: &str) -> Result<CancelAnswer, StoreError> {
        let answer = self.store.run_cancel(run_id, now_ms()).await?;
        if matches!(answer, CancelAnswer::Cancelled { .. }) {
            self.hub.wake(run_id);
        }
        Ok(answer)
    }

    /// Executes a run this segment holds, to an outcome (never an error). A run that has
    /// events already (a claimed, requeued run) resumes from them: the conversation is
    /// rebuilt from the stored steps and only the work not yet recorded is done, so a write
    /// that was recorded is never made twice.
    pub async fn execute(
        &self,
        run: &Run,
        agent: &AgentSpec,
        prompt: &str,
        observer: Option<Observer>,
    ) -> Outcome {
        self.execute_with(run, agent, prompt, observer, &SegmentOptions::default())
            .await
    }

    /// [`execute`](Self::execute) for a segment of a queued run: retryable failures
    /// requeue it, a drain hands it back at the next boundary.
    pub async fn execute_with(
        &self,
        run: &Run,
        agent: &AgentSpec,
        prompt: &str,
        observer: Option<Observer>,
        options: &SegmentOptions,
    ) -> Outcome {
        // O5: a segment of a run is one span; its steps and their calls are its children.
        let span = tracing::info_span!(
            "run",
            run.id = %run.id,
            run.agent = %agent.name,
            outcome = tracing::field::Empty,
        );
        // Boxed: a segment's future nests the step loop, each step and the MCP and model
        // calls under them, deeper than the compiler lays out by default inside a
        // caller's own async fn; one allocation per segment keeps every caller clear.
        let segment = Box::pin(self.execute_in_span(run, agent, prompt, observer, options));
        let outcome = segment.instrument(span.clone()).await;
        span.record("outcome", outcome.as_str());
        outcome
    }
}

/// The stored request of a run: its prompt, and its budgets when it has any (R13), so a
/// requeued or resumed run keeps them. Without budgets it is the shape stored before they
/// existed.
pub fn run_request(prompt: &str, budgets: &Budgets) -> Value {
    let mut request = json!({ "prompt": prompt });
    if !budgets.is_empty() {
        request[crate::budget::REQUEST_BUDGETS_FIELD] = json!(budgets);
    }
    request
}
