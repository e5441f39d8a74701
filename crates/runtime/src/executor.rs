//! The step loop (R2): model call, the tool calls it asked for, the next round; with a
//! lease (R3), the step-boundary probe (R5), the in-flight signal (R6), the write fence
//! (R7) and fail-closed recording of write steps (R8).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_mcp::{CallGate, Effect, McpCall, ToolOutcome};
use runwarden_models::{FinishReason, Message, ModelRequest, ToolCallRequest};
use runwarden_vault::Delivery;
use runwarden_vault::store::StoreError;
use serde_json::{Value, json};

use crate::agent::{AgentSpec, BoundTool};
use crate::budget::{BudgetStop, Budgets};
use crate::decision::{
    Answer, Decision, DecisionAsk, DecisionKind, DecisionStatus, arguments_hash,
};
use crate::events::{
    DecisionAnswered, DecisionAsked, EffectUncertain, EventBody, EventDecodeError, Leg,
    ModelCancelled, ModelFailed, ModelProgress, ModelResponse, RunEnded, RunRequeued, RunResumed,
    RunStarted, RunStopped, StepOutcome, ToolExecuted,
};
use tracing::Instrument as _;

use crate::progress::{PROGRESS_INTERVAL, ProgressEvents, ProgressTarget};
use crate::queue::{DeadLetter, QueueStore, RequeueAnswer};
use crate::requeue::{apply_held, decide_held};
use crate::retry::{RequeueCause, RetryDecision, RetryPolicy};
use crate::signal::{CancelHub, RunSignal, is_run_cancelled};
use crate::state::{EFFECT_UNCERTAIN, MODEL_NO_ANSWER, MODEL_TRUNCATED, Outcome, RunState};
use crate::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunEnd,
    RunEvent, RunSettle, RunStore, SettleAnswer,
};
use crate::tool_notices::{CallLabel, ToolNotices};
use crate::watcher::StatusWatcher;

mod store_refused;

/// The default lease of an executing segment (R3).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default interval of the background heartbeat.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

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

/// Sees every event right after it was stored (the CLI prints them as they happen).
pub type Observer = Arc<dyn Fn(&RunEvent) + Send + Sync>;

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
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn ms(duration: Duration) -> i64 {
    duration.as_millis() as i64
}

/// How one step's recording went.
enum Recorded {
    Stored,
    LostRun,
    Failed(StoreError),
}

/// Stops a background task of the segment (the heartbeat, the wall-clock budget timer)
/// when the segment ends, however it ends.
struct HeartbeatGuard(tokio::task::JoinHandle<()>);

impl Drop for HeartbeatGuard {
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

    /// A call of the run came back cancelled at `returned`: when the run was cancelled
    /// and the hub woke it, report the time from the wake-up to the return.
    fn observe_cancel(&self, segment: &Segment<'_>, returned: Instant, outcome: Outcome) {
        if outcome != Outcome::Cancelled {
            return; // a lost lease also wakes the signal; it is not a cancel
        }
        if let (Some(observer), Some(woken)) =
            (&self.cancel_latency, self.hub.woken_at(&segment.run.id))
        {
            observer(returned.saturating_duration_since(woken));
        }
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
        self.create_sync_with(agent, prompt, &Budgets::default())
            .await
    }

    /// [`create_sync`](Self::create_sync) with the run's own budgets (R13), stored with its
    /// request; the caller checked them against the agent's.
    pub async fn create_sync_with(
        &self,
        agent: &str,
        prompt: &str,
        budgets: &Budgets,
    ) -> Result<Run, StoreError> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_ms();
        self.store
            .run_create(RunCreate {
                id: id.clone(),
                agent: agent.to_string(),
                correlation: id,
                request: Some(run_request(prompt, budgets)),
                status: NewRunStatus::Running {
                    owner: self.config.owner.clone(),
                    lease_until_ms: now + ms(self.config.lease),
                },
                now_ms: now,
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

    /// R6 (amended): the call's signal, whose first answer is a read made now, before the
    /// call reaches the vault (and so before any secret is touched).
    async fn signal(&self, segment: &Segment<'_>) -> RunSignal {
        self.watcher
            .signal(&segment.run.id)
            .await
            .with_stop(segment.lease_lost.clone())
            // R13: a budget that runs out stops the call like a cancel.
            .with_stop(segment.budget.flag())
    }

    /// R13: the wall-clock budget, measured from the run's creation: a timer that trips
    /// the budget stop and wakes the run's calls at once, as a cancel would.
    fn wall_timer(&self, segment: &Segment<'_>) -> Option<HeartbeatGuard> {
        let seconds = segment.budgets.max_wall_seconds?;
        let deadline_ms = segment
            .run
            .created_ms
            .saturating_add(i64::try_from(seconds.saturating_mul(1_000)).unwrap_or(i64::MAX));
        let what = format!("max_wall_seconds = {seconds}");
        let left = deadline_ms.saturating_sub(now_ms());
        if left <= 0 {
            segment.budget.trip(what);
            return None;
        }
        let (budget, hub, id) = (
            segment.budget.clone(),
            self.hub.clone(),
            segment.run.id.clone(),
        );
        Some(HeartbeatGuard(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
            budget.trip(what);
            hub.wake(&id);
        })))
    }

    /// While a model call streams, what it has produced so far (L6): counted against the
    /// run's token total (R13: going over trips the budget and wakes the call, which the
    /// vault then tears down like a cancelled one), and reported as throttled
    /// `model_progress` events. Call [`ProgressEvents::finish`] before recording the step.
    fn stream_progress(
        &self,
        segment: &Segment<'_>,
        round: u32,
    ) -> (runwarden_models::Progress, ProgressEvents) {
        let events = ProgressEvents::start(
            ProgressTarget {
                store: self.store.clone(),
                run_id: segment.run.id.clone(),
                owner: self.config.owner.clone(),
                epoch: segment.run.claim_epoch,
                observer: segment.observer.clone(),
            },
            self.config.progress_interval,
        );
        let reporter = events.reporter();
        let max = segment.budgets.max_output_tokens_total;
        let before = segment
            .spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .output_tokens;
        let (budget, hub, id) = (
            segment.budget.clone(),
            self.hub.clone(),
            segment.run.id.clone(),
        );
        let progress = runwarden_models::Progress::new(move |so_far| {
            reporter.send_replace(Some(EventBody::ModelProgress(ModelProgress {
                round,
                tokens: so_far,
            })));
            let total = before.saturating_add(so_far);
            if let Some(max) = max
                && total > max
                && !budget.is_tripped()
            {
                budget.trip(format!(
                    "max_output_tokens_total = {max} (the run used {total})"
                ));
                hub.wake(&id);
            }
        });
        (progress, events)
    }

    /// R13: counts a model step's output tokens; going over the total trips the budget.
    fn spend_tokens(&self, segment: &Segment<'_>, output_tokens: u64) {
        let mut spent = segment.spent.lock().unwrap_or_else(|p| p.into_inner());
        spent.output_tokens = spent.output_tokens.saturating_add(output_tokens);
        if let Some(max) = segment.budgets.max_output_tokens_total
            && spent.output_tokens > max
        {
            segment.budget.trip(format!(
                "max_output_tokens_total = {max} (the run used {})",
                spent.output_tokens
            ));
        }
    }

    /// R13: before a model call, a spent output-token total leaves nothing for it.
    fn tokens_left(&self, segment: &Segment<'_>) {
        let spent = segment.spent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(max) = segment.budgets.max_output_tokens_total
            && spent.output_tokens >= max
        {
            segment.budget.trip(format!(
                "max_output_tokens_total = {max} (the run used {})",
                spent.output_tokens
            ));
        }
    }

    /// R13: the `max_tokens` that lets this call go one token past the run's remaining
    /// output budget and no further: the server stops there by itself even if our
    /// teardown were late, and the token past the budget trips it (so the run ends
    /// `BUDGET_EXCEEDED`, not `MODEL_TRUNCATED`). `None` when the run has no token total.
    fn tokens_cap(&self, segment: &Segment<'_>) -> Option<u32> {
        let max = segment.budgets.max_output_tokens_total?;
        let spent = segment
            .spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .output_tokens;
        let left = max.saturating_sub(spent).saturating_add(1);
        Some(u32::try_from(left).unwrap_or(u32::MAX))
    }

    /// R13: counts a tool call before it is made; `false` (and the budget tripped) when
    /// the run may make no more.
    fn take_tool_call(&self, segment: &Segment<'_>) -> bool {
        let mut spent = segment.spent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(max) = segment.budgets.max_tool_calls
            && spent.tool_calls >= max
        {
            segment.budget.trip(format!(
                "max_tool_calls = {max} (the run made {})",
                spent.tool_calls
            ));
            return false;
        }
        spent.tool_calls = spent.tool_calls.saturating_add(1);
        true
    }

    /// Renews the lease in the background while calls are in flight; a renewal that
    /// matches no row marks the lease lost and stops in-flight calls at once (R3).
    ///
    /// Each renewal is bounded by half a beat, so a store that hangs cannot hold the
    /// heartbeat. When renewals keep failing and the lease as last confirmed could run out
    /// before the next renewal answers, the segment fences itself: it stops its calls and starts no
    /// new request (the lease is treated as lost), says so at WARN with the cause, and
    /// leaves the run to the reaper once the lease has run out.
    fn heartbeat(&self, run: &Run, lease_lost: Arc<AtomicBool>) -> HeartbeatGuard {
        let (store, hub, config, id) = (
            self.store.clone(),
            self.hub.clone(),
            self.config.clone(),
            run.id.clone(),
        );
        // The lease the claim confirmed; a run without one (executed directly) has a
        // fresh lease from now.
        let mut held_until = run
            .lease_expires_ms
            .unwrap_or_else(|| now_ms() + ms(config.lease));
        let epoch = run.claim_epoch;
        HeartbeatGuard(tokio::spawn(async move {
            let mut tick = tokio::time::interval(config.heartbeat);
            tick.tick().await; // the first tick is immediate; the lease is fresh
            loop {
                tick.tick().await;
                let now = now_ms();
                let beat = Heartbeat {
                    id: id.clone(),
                    owner: config.owner.clone(),
                    epoch,
                    lease_until_ms: now + ms(config.lease),
                    now_ms: now,
                };
                let lease_until = beat.lease_until_ms;
                let bound = config.heartbeat / 2;
                let cause = match tokio::time::timeout(bound, store.run_heartbeat(beat)).await {
                    Ok(Ok(true)) => {
                        held_until = lease_until;
                        continue;
                    }
                    Ok(Ok(false)) => {
                        lease_lost.store(true, Ordering::SeqCst);
                        hub.wake(&id);
                        return;
                    }
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("the store did not answer the renewal within {bound:?}"),
                };
                // Self-fencing: another worker may claim the run once the lease runs out.
                // The next renewal could answer as late as a beat and a half from now, so
                // the segment stops unless the lease outlasts that.
                if now_ms() + ms(config.heartbeat + bound) >= held_until {
                    tracing::warn!(run = %id, %cause, "the lease could not be renewed and runs out soon; this worker stops the run's calls and starts no new request for it");
                    lease_lost.store(true, Ordering::SeqCst);
                    hub.wake(&id);
                    return;
                }
                tracing::warn!(run = %id, %cause, "the heartbeat could not renew the lease; trying again at the next beat");
            }
        }))
    }

    async fn record(
        &self,
        segment: &Segment<'_>,
        body: EventBody,
        clear_fence: bool,
        round: Option<u32>,
    ) -> Recorded {
        self.record_ending(segment, body, clear_fence, round, None)
            .await
    }

    /// [`record`](Self::record), and with `end` the status change that ends the run in
    /// the same transaction (one truth per run).
    async fn record_ending(
        &self,
        segment: &Segment<'_>,
        body: EventBody,
        clear_fence: bool,
        round: Option<u32>,
        end: Option<RunEnd>,
    ) -> Recorded {
        let (kind, payload) = (body.kind(), body.to_payload());
        let time_ms = now_ms();
        let append = EventAppend {
            id: segment.run.id.clone(),
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            kind: kind.to_string(),
            payload: payload.clone(),
            clear_fence,
            round,
            end,
            now_ms: time_ms,
        };
        match self.store.run_event_append(append).await {
            Ok(Some(seq)) => {
                if crate::events::is_final_kind(kind) {
                    segment.ended.store(true, Ordering::SeqCst);
                }
                if let Some(observer) = &segment.observer {
                    observer(&RunEvent {
                        run_id: segment.run.id.clone(),
                        seq,
                        kind: kind.to_string(),
                        payload,
                        time_ms,
                    });
                }
                Recorded::Stored
            }
            Ok(None) => Recorded::LostRun,
            Err(error) => Recorded::Failed(error),
        }
    }

    /// Records a step where a failure to record is tolerated (R8: read-only steps stay
    /// fail-soft); `None` means the segment lost the run and must stop.
    async fn record_soft(
        &self,
        segment: &Segment<'_>,
        body: EventBody,
        round: Option<u32>,
    ) -> Option<()> {
        let kind = body.kind();
        match self.record(segment, body, false, round).await {
            Recorded::Stored => Some(()),
            Recorded::LostRun => None,
            Recorded::Failed(error) => {
                tracing::warn!(run = %segment.run.id, kind, %error, "could not record a step; going on");
                Some(())
            }
        }
    }

    /// Why the segment stops at a boundary, if it must: a cancel (R5), a lost lease (R3),
    /// or a budget that ran out (R13), which settles the run as failed with
    /// `BUDGET_EXCEEDED` (never retried; a write's fence stays as after a cancel).
    async fn must_stop(&self, segment: &Segment<'_>) -> Option<Outcome> {
        if is_run_cancelled(&*self.store, &segment.run.id).await {
            Some(Outcome::Cancelled)
        } else if segment.lease_lost.load(Ordering::SeqCst) {
            Some(Outcome::LeaseLost)
        } else if let Some(reason) = segment.budget.reason() {
            Some(self.settle(segment, RunState::Failed, reason).await)
        } else {
            None
        }
    }

    /// At a step boundary: stop for a cancel or a lost lease, or hand the run back to the
    /// queue when the worker is draining.
    async fn boundary(&self, segment: &Segment<'_>) -> Option<Outcome> {
        if let Some(stop) = self.must_stop(segment).await {
            return Some(stop);
        }
        let draining = segment
            .options
            .drain
            .as_ref()
            .is_some_and(|d| d.load(Ordering::SeqCst));
        if draining {
            return Some(
                self.requeue(
                    segment,
                    "the worker stopped; the run goes back to the queue".into(),
                    RequeueCause::Drain,
                )
                .await,
            );
        }
        None
    }

    /// Ends a segment for a failure: a queued run with a retry policy is requeued when the
    /// failure is retryable and dead-lettered (`NOT_RETRYABLE`) when it is not (R9); a
    /// synchronous run is settled as failed.
    async fn fail(&self, segment: &Segment<'_>, reason: String, retryable: bool) -> Outcome {
        match (&segment.options.retry, retryable) {
            (None, _) => self.settle(segment, RunState::Failed, reason).await,
            (Some(_), true) => self.requeue(segment, reason, RequeueCause::Failure).await,
            (Some(_), false) => {
                let reason = format!("{}: {reason}", DeadLetter::NotRetryable.as_str());
                match self.settle(segment, RunState::Failed, reason).await {
                    Outcome::Failed => Outcome::DeadLettered,
                    other => other,
                }
            }
        }
    }

    /// Puts the run back in the queue, or dead-letters it, as the retry policy decides on
    /// the run read now (R9); the store applies a requeue with a guard that re-checks
    /// what was read. The step says which: `run_requeued`, or `run_failed` for a dead
    /// letter (written with the status change that ends the run).
    async fn requeue(&self, segment: &Segment<'_>, reason: String, cause: RequeueCause) -> Outcome {
        let Some(queue) = self.queue.clone() else {
            return self.settle(segment, RunState::Failed, reason).await;
        };
        let policy = segment.options.retry.unwrap_or_default();
        let owner = &self.config.owner;
        let held = (owner.as_str(), segment.run.claim_epoch);
        let decided = match decide_held(&*queue, &policy, &segment.run.id, held, cause).await {
            Ok(Ok(decided)) => decided,
            Ok(Err(answer)) => return requeue_outcome(answer),
            Err(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                tracing::error!(run = %segment.run.id, %error, "could not read the run to requeue it; its lease will run out");
                return Outcome::LeaseLost;
            }
        };
        let body = match decided.decision {
            RetryDecision::Requeue { retry_at_ms } => EventBody::RunRequeued(RunRequeued {
                reason: reason.clone(),
                counts: cause.counts(),
                retry_in_ms: u64::try_from(retry_at_ms.saturating_sub(decided.now_ms)).unwrap_or(0),
            }),
            RetryDecision::DeadLetter(_) => {
                // The dead letter is the run's end: its final step and its status go in
                // one transaction, under this segment's claim (which no one else can
                // change the count or the fence under).
                let reason = decided.reason(&reason);
                return match self.settle(segment, RunState::Failed, reason).await {
                    Outcome::Failed => Outcome::DeadLettered,
                    other => other,
                };
            }
        };
        if self.record(segment, body, false, None).await.is_lost() {
            return Outcome::LeaseLost;
        }
        match apply_held(&*queue, &decided, owner, &reason).await {
            Ok(answer) => requeue_outcome(answer),
            Err(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                tracing::error!(run = %segment.run.id, %error, "could not requeue the run; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }

    /// Records the terminal step and settles the row in one transaction, so the row and
    /// the log never disagree. When a cancel won the row first, the segment reports the
    /// cancel (the winner's outcome) and records its stop; when the store did not confirm
    /// the write, the run is left to its lease (never reported as failed: a later segment
    /// may still complete it).
    async fn settle(&self, segment: &Segment<'_>, status: RunState, reason: String) -> Outcome {
        let ended = RunEnded {
            reason: reason.clone(),
        };
        let body = if status == RunState::Completed {
            EventBody::RunCompleted(ended)
        } else {
            EventBody::RunFailed(ended)
        };
        let end = RunEnd { status, reason };
        match self
            .record_ending(segment, body, false, None, Some(end))
            .await
        {
            Recorded::Stored if status == RunState::Completed => Outcome::Completed,
            Recorded::Stored => Outcome::Failed,
            Recorded::LostRun => {
                if is_run_cancelled(&*self.store, &segment.run.id).await {
                    Outcome::Cancelled // the segment's caller records the stop
                } else {
                    Outcome::LeaseLost
                }
            }
            Recorded::Failed(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                tracing::error!(run = %segment.run.id, %error, "could not record the run's end; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }

    /// Settles the row only: the terminal step is already in the log (R8: a resumed run
    /// whose end was recorded settles from the log and never writes a second one).
    async fn settle_row(&self, segment: &Segment<'_>, status: RunState, reason: String) -> Outcome {
        let settle = RunSettle {
            id: segment.run.id.clone(),
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            status,
            reason,
            now_ms: now_ms(),
        };
        match self.store.run_settle(settle).await {
            Ok(SettleAnswer::Settled) if status == RunState::Completed => Outcome::Completed,
            Ok(SettleAnswer::Settled) => Outcome::Failed,
            Ok(SettleAnswer::AlreadyCancelled) => Outcome::Cancelled,
            Ok(SettleAnswer::LeaseLost) => Outcome::LeaseLost,
            Err(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                // Not a failure of the run: a later segment settles it from the log.
                tracing::error!(run = %segment.run.id, %error, "could not settle the run; its lease will run out");
                Outcome::LeaseLost
            }
        }
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
        let outcome = self
            .execute_in_span(run, agent, prompt, observer, options)
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome.as_str());
        outcome
    }

    async fn execute_in_span(
        &self,
        run: &Run,
        agent: &AgentSpec,
        prompt: &str,
        observer: Option<Observer>,
        options: &SegmentOptions,
    ) -> Outcome {
        let lease_lost = Arc::new(AtomicBool::new(false));
        let _heartbeat = self.heartbeat(run, lease_lost.clone());
        // R13: the request's budgets were checked against the agent's when it was taken;
        // the lower of the two applies, so a request stored before an agent lowered its
        // own cannot raise it.
        let budgets = agent
            .budgets
            .lowered_by(&Budgets::from_request(run.request.as_ref()));
        let segment = Segment {
            run,
            agent,
            observer,
            lease_lost,
            options,
            budgets,
            budget: Arc::default(),
            spent: Mutex::default(),
            approvals: Mutex::default(),
            ended: AtomicBool::new(false),
            inputs: Mutex::default(),
        };
        let history = match self.store.run_events(&run.id, 0, 0).await {
            Ok(history) => history,
            Err(error) => {
                // Without its history a resumed run could repeat recorded work: stop here
                // and let the lease run out (the reaper decides).
                tracing::error!(run = %run.id, %error, "could not read the run's history; not executing it, its lease will run out");
                return Outcome::LeaseLost;
            }
        };
        let progress = match Progress::replay(prompt, &history, agent.max_tokens) {
            Ok(progress) => progress,
            Err(error) => {
                // An event this binary cannot read: resuming on a guess could repeat a
                // write or drop a step, so the run fails with the event named. A damaged
                // log does not heal on retry.
                tracing::error!(run = %run.id, %error, "could not read the run's history");
                let reason = format!("the run's history could not be read: {error}");
                return self.fail(&segment, reason, false).await;
            }
        };
        if let Some((status, reason)) = progress.terminal.clone() {
            // R8: the run's end is in the log but the row was not settled (a crash in
            // between): settle from the log, call nothing, write no second terminal step.
            return self.settle_row(&segment, status, reason).await;
        }
        let body = if history.is_empty() {
            EventBody::RunStarted(RunStarted {
                agent: agent.name.clone(),
                prompt: prompt.to_string(),
                owner: self.config.owner.clone(),
            })
        } else {
            EventBody::RunResumed(RunResumed {
                owner: self.config.owner.clone(),
                from_round: progress.round,
                attempt: run.requeue_count + 1,
            })
        };
        if self.record_soft(&segment, body, None).await.is_none() {
            return Outcome::LeaseLost;
        }
        *segment.spent.lock().unwrap_or_else(|p| p.into_inner()) = progress.spent;
        *segment.approvals.lock().unwrap_or_else(|p| p.into_inner()) = progress.approvals.clone();
        *segment.inputs.lock().unwrap_or_else(|p| p.into_inner()) = progress.inputs.clone();
        let _wall = self.wall_timer(&segment);
        let outcome = self.rounds(&segment, progress).await;
        if matches!(outcome, Outcome::Cancelled) && !segment.ended.load(Ordering::SeqCst) {
            // The cancel already won the row: mark the stop for readers, settle nothing.
            // R8: unless this segment's end is in the log already (a cancel that won the
            // row between the final step and the settle): never two terminal events.
            let stopped = EventBody::RunStopped(RunStopped {
                outcome,
                reason: None,
            });
            let _ = self.record(&segment, stopped, false, None).await;
        }
        outcome
    }

    async fn rounds(&self, segment: &Segment<'_>, progress: Progress) -> Outcome {
        let agent = segment.agent;
        let Progress {
            mut messages,
            round: last_round,
            unanswered,
            final_answer,
            uncertain_write,
            unusable_turn: unusable_last_turn,
            terminal: _,
            spent: _,
            approvals: _,
            inputs: _,
            reissue_asked: _,
        } = progress;
        if let Some(uncertain) = uncertain_write {
            // R11: a non-idempotent write whose effect is unknown is never re-sent. R12: a
            // person says what it did; a run stopped before it asked asks now.
            if uncertain.asked {
                return self
                    .settle(segment, RunState::Failed, uncertain.reason)
                    .await;
            }
            let message = uncertain.reason.clone();
            return self
                .ask(
                    segment,
                    DecisionKind::EffectUncertain,
                    uncertain.round,
                    &uncertain.call,
                    Question::said(message),
                )
                .await;
        }
        if let Some(reason) = unusable_last_turn {
            // L4: the stored last turn was cut (or empty): it fails the run on resume too,
            // with the budget as the reason when the budget cut it (R13).
            self.tokens_left(segment);
            let reason = segment
                .budget
                .reason()
                .filter(|_| reason.starts_with(MODEL_TRUNCATED))
                .unwrap_or(reason);
            return self.settle(segment, RunState::Failed, reason).await;
        }
        if let Some(text) = final_answer {
            // R8: the final answer is stored; the model is not asked again.
            return self.settle(segment, RunState::Completed, text).await;
        }
        let tools: Vec<_> = agent.tools.iter().map(|t| t.spec.clone()).collect();
        // A resumed run first finishes the tool calls its last model turn asked for.
        for call in &unanswered {
            if let Some(stop) = self.boundary(segment).await {
                return stop;
            }
            match self.tool_step(segment, last_round, call).await {
                Ok(result) => messages.push(result),
                Err(outcome) => return outcome,
            }
        }
        for round in last_round + 1..=agent.max_rounds {
            self.tokens_left(segment);
            if let Some(stop) = self.boundary(segment).await {
                return stop;
            }
            let (progress, progress_events) = self.stream_progress(segment, round);
            let request = ModelRequest {
                system: agent.system.clone(),
                messages: messages.clone(),
                tools: tools.clone(),
                correlation: Some(segment.run.correlation.clone()),
                progress: Some(progress),
                max_tokens: self.tokens_cap(segment),
            };
            let signal = self.signal(segment).await;
            let completed = agent
                .provider
                .complete(&request, Some(&signal))
                .instrument(tracing::info_span!("model_call", round))
                .await;
            let returned = Instant::now();
            // No progress event may follow the step that ends the call.
            progress_events.finish().await;
            let turn = match completed {
                Ok(turn) => turn,
                Err(error) if error.is_cancelled() => {
                    // The step goes first: a budget stop settles the run, and nothing may
                    // follow the terminal step in the log.
                    let body = EventBody::ModelCancelled(ModelCancelled {
                        round,
                        error: error.to_string(),
                    });
                    let _ = self.record_soft(segment, body, Some(round)).await;
                    let stop = self.must_stop(segment).await.unwrap_or(Outcome::Cancelled);
                    self.observe_cancel(segment, returned, stop);
                    return stop;
                }
                Err(error) => {
                    let body = EventBody::ModelFailed(ModelFailed {
                        round,
                        error: error.to_string(),
                        retryable: error.is_retryable(),
                        delivery: error.delivery(),
                    });
                    if self.record_soft(segment, body, Some(round)).await.is_none() {
                        return Outcome::LeaseLost;
                    }
                    return self
                        .fail(
                            segment,
                            format!("the model call failed: {error}"),
                            error.is_retryable(),
                        )
                        .await;
                }
            };
            let step = ModelResponse {
                round,
                text: turn.text.clone(),
                tool_calls: turn.tool_calls.clone(),
                finish: turn.finish.clone(),
                usage: turn.usage,
            };
            let unusable = unusable_turn(&step, agent.max_tokens);
            let body = EventBody::ModelResponse(step);
            match self.record(segment, body, false, Some(round)).await {
                Recorded::Stored => {}
                Recorded::LostRun => return Outcome::LeaseLost,
                Recorded::Failed(error) if !turn.tool_calls.is_empty() && unusable.is_none() => {
                    // R8 (amended): a tool call runs only if the step that asked for it is
                    // durable, or a resumed run would replay the turn and call it again.
                    return self
                        .fail(
                            segment,
                            format!("the model's step could not be recorded, so the tool calls it asked for were not made: {error}"),
                            true,
                        )
                        .await;
                }
                Recorded::Failed(error) => {
                    // A final answer with no call behind it: the settle below stores it.
                    tracing::warn!(run = %segment.run.id, %error, "could not record the model's final step; settling with its text");
                }
            }
            self.spend_tokens(segment, turn.usage.map_or(0, |u| u.output_tokens));
            if let Some(reason) = unusable {
                // L4: a cut turn is never a final answer and its tool calls never run;
                // the same request would be cut again, so it is not retried. R13: when
                // the cut came from the run's token budget, the budget is the reason.
                let reason = truncated_by_budget(segment, &turn).unwrap_or(reason);
                return self.settle(segment, RunState::Failed, reason).await;
            }
            if let Some(stop) = self.boundary(segment).await {
                return stop; // R5: the boundary step is stored; stop without settling
            }
            if turn.tool_calls.is_empty() {
                let text = turn.text.unwrap_or_default();
                return self.settle(segment, RunState::Completed, text).await;
            }
            messages.push(Message::Assistant {
                text: turn.text.clone(),
                tool_calls: turn.tool_calls.clone(),
            });
            for call in &turn.tool_calls {
                match self.tool_step(segment, round, call).await {
                    Ok(result) => messages.push(result),
                    Err(outcome) => return outcome,
                }
                if let Some(stop) = self.boundary(segment).await {
                    return stop; // R5
                }
            }
        }
        self.fail(
            segment,
            format!("no final answer within {} rounds", agent.max_rounds),
            false,
        )
        .await
    }

    /// One tool execution as a step. `Err` is the segment's outcome when it must stop.
    async fn tool_step(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
    ) -> Result<Message, Outcome> {
        let answer = |content: String, is_error: bool| Message::Tool {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        };
        let Some(tool) = segment
            .agent
            .tools
            .iter()
            .find(|t| t.spec.name == call.name)
        else {
            let text = format!("no tool named {:?} is offered to this agent", call.name);
            let body = EventBody::ToolExecuted(ToolExecuted::refused(round, call, &text));
            self.record_soft(segment, body, None)
                .await
                .ok_or(Outcome::LeaseLost)?;
            return Ok(answer(text, true));
        };
        let Value::Object(mut arguments) = call.arguments.clone() else {
            // L4: arguments the model wrote badly reach it as the tool's error, never `{}`.
            let text = match &call.invalid_arguments {
                // The vault refused arguments that carry a secret's value: its words.
                Some(why) if why.contains("(secret_exfiltration)") => why.clone(),
                Some(why) => format!("arguments were not valid JSON: {why}"),
                None => "the tool's arguments must be a JSON object".to_string(),
            };
            let body = EventBody::ToolExecuted(ToolExecuted::refused(round, call, &text));
            self.record_soft(segment, body, None)
                .await
                .ok_or(Outcome::LeaseLost)?;
            return Ok(answer(text, true));
        };
        let mut edited_note = String::new();
        if tool.approval.is_some() {
            // R12: the call waits for an operator; the answer is in the log once given.
            let answered = segment
                .approvals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&call.id)
                .cloned();
            let Some(answered) = answered else {
                return Err(self
                    .ask(
                        segment,
                        DecisionKind::Approval,
                        round,
                        call,
                        Question::default(),
                    )
                    .await);
            };
            let denial = if answered.arguments_hash != arguments_hash(&call.arguments) {
                // R12: an answer is bound to the exact arguments it was asked about.
                Some("the approval was given for other arguments".to_string())
            } else if answered.answer == Answer::Approve {
                None
            } else {
                Some(
                    answered
                        .reason
                        .clone()
                        .unwrap_or_else(|| answered.answer.as_str().to_string()),
                )
            };
            if let Some(reason) = denial {
                let text = format!("denied by an operator: {reason}");
                let mut step = ToolExecuted::refused(round, call, &text);
                step.outcome = StepOutcome::Denied;
                step.remote = Some(tool.remote_name.clone());
                step.server = Some(tool.client.server().name.clone());
                step.effect = Some(tool.effect);
                step.sent = Some(false);
                self.record_soft(segment, EventBody::ToolExecuted(step), None)
                    .await
                    .ok_or(Outcome::LeaseLost)?;
                return Ok(answer(text, true));
            }
            if let Some(Value::Object(edited)) = answered.arguments {
                // R12: the operator's edit was checked against the tool's schema when it
                // was given; both are recorded (the model's in its step, the edit in the
                // answer), and the model is told.
                edited_note = format!(
                    "an operator changed the arguments to {}; ",
                    Value::Object(edited.clone())
                );
                arguments = edited;
            }
        }
        // M19, R12: the server asked for input and an operator answered: the call is
        // re-issued with the answer and the server's `requestState`, exactly as stored.
        let taken = segment
            .inputs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&call.id);
        let input_resume = match taken {
            Some(decision_id) => match self.store.decision_get(&decision_id).await {
                Ok(Some(decision)) => decision.reissue.as_ref().map(|reissue| {
                    let mut responses = serde_json::Map::new();
                    responses.insert(reissue.input_key.clone(), decision.elicitation_result());
                    runwarden_mcp::InputResume {
                        responses,
                        request_state: reissue.request_state.clone(),
                    }
                }),
                Ok(None) => None,
                Err(error) => {
                    // Nothing was sent: a retry reads it again.
                    let reason = format!("the operator's answer could not be read: {error}");
                    return Err(self.fail(segment, reason, true).await);
                }
            },
            None => None,
        };
        if !self.take_tool_call(segment) {
            // R13: counted before the call; the budget's stop settles the run.
            return Err(self.must_stop(segment).await.unwrap_or(Outcome::Failed));
        }
        let is_write = tool.effect.is_write();
        let fence_failure = Arc::new(Mutex::new(None));
        let signal = self.signal(segment).await;
        // M15: the server's progress and logs become throttled, bounded run events.
        let notices = ToolNotices::start(
            ProgressTarget {
                store: self.store.clone(),
                run_id: segment.run.id.clone(),
                owner: self.config.owner.clone(),
                epoch: segment.run.claim_epoch,
                observer: segment.observer.clone(),
            },
            self.config.progress_interval,
            CallLabel {
                round,
                call_id: call.id.clone(),
                tool: tool.spec.name.clone(),
            },
        );
        let mcp_call = McpCall {
            tool: tool.remote_name.clone(),
            arguments,
            correlation: Some(segment.run.correlation.clone()),
            // R11: the fence is stamped after the session is ready, right before the first
            // byte of tools/call, so a crash in the handshake never fences the run.
            gate: is_write.then(|| self.fence_gate(segment, tool, fence_failure.clone())),
            // M14, R12: a server's question becomes an `input` decision of this run; the
            // client consults it only when the server's policy is "operator".
            elicitor: Some(runwarden_mcp::ElicitorHandle(Arc::new(
                crate::elicitor::RunElicitor::new(
                    self.store.clone(),
                    &segment.run.id,
                    &self.config.owner,
                    segment.run.claim_epoch,
                    round,
                    &call.id,
                    &call.name,
                    call.arguments.clone(),
                ),
            ))),
            // M7 (amended): the structured result is checked against what the tool declared.
            output_schema: tool.output_schema.clone(),
            notices: Some(notices.sink()),
            // M19, R12: a server's `input_required` parks the run on an `input` decision.
            park_on_input: true,
            resume: input_resume,
            forced: false,
        };
        let span = tracing::info_span!(
            "tool_call",
            round,
            tool = %call.name,
            server = %tool.client.server().name,
            arguments = tracing::field::Empty,
        );
        if self.config.record_arguments {
            span.record("arguments", call.arguments.to_string());
        }
        let outcome = tool
            .client
            .call_tool(mcp_call, Some(&signal))
            .instrument(span)
            .await;
        let returned = Instant::now();
        // No progress or log event may follow the step that ends the call.
        notices.finish().await;
        let failure = fence_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(failure) = failure {
            return Err(self.fence_failed(segment, failure).await);
        }
        if let Some(fault) = outcome.result.error.as_ref().filter(|e| e.is_store_fault()) {
            let problem = fault.to_string();
            return Err(self
                .store_refused(segment, round, &call.id, &call.name, problem)
                .await);
        }
        if let Some(asked) = outcome.input_required {
            // M19, R12: nothing of the tool's work was done; the run parks on an `input`
            // decision holding the server's `requestState`, and whichever worker resumes
            // it re-issues the call with the answer. The fence is cleared with the park.
            let Some(question) = asked.requests.first() else {
                let reason = "the server asked for input but named no question".to_string();
                return Err(self.fail(segment, reason, false).await);
            };
            let message = question
                .params
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .chars()
                .take(2_000)
                .collect::<String>();
            let message = format!("{} asks: {message}", tool.client.server().name);
            let reissue = crate::decision::Reissue {
                input_key: question.key.clone(),
                request_state: asked.request_state.clone(),
            };
            return Err(self
                .ask(
                    segment,
                    DecisionKind::Input,
                    round,
                    call,
                    Question {
                        message: Some(message),
                        requested_schema: question.params.get("requestedSchema").cloned(),
                        reissue: Some(reissue),
                    },
                )
                .await);
        }
        let result = outcome.result;
        let label = match result.outcome {
            ToolOutcome::Succeeded => StepOutcome::Succeeded,
            ToolOutcome::ToolError => StepOutcome::ToolError,
            ToolOutcome::Failed => StepOutcome::Failed,
            ToolOutcome::Cancelled => StepOutcome::Cancelled,
        };
        // R11: a write that may have reached the server without an answer keeps its fence
        // and its step says so; nothing guesses that it did not run.
        let uncertain = is_write && result.delivery == Delivery::MaybeDelivered;
        let body = if uncertain {
            let legs = outcome
                .legs
                .iter()
                .map(|l| Leg {
                    method: l.method.clone(),
                    answered: l.answered,
                    audit_id: l.audit_id,
                    millis: u64::try_from(l.elapsed.as_millis()).unwrap_or(u64::MAX),
                })
                .collect();
            EventBody::EffectUncertain(EffectUncertain {
                round,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                remote: tool.remote_name.clone(),
                server: tool.client.server().name.clone(),
                effect: tool.effect,
                outcome: label,
                delivery: result.delivery,
                sent: result.sent(),
                text: result.text.clone(),
                request_id: outcome.request_id,
                legs,
            })
        } else {
            EventBody::ToolExecuted(ToolExecuted {
                round,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                remote: Some(tool.remote_name.clone()),
                server: Some(tool.client.server().name.clone()),
                effect: Some(tool.effect),
                outcome: label,
                delivery: Some(result.delivery),
                sent: Some(result.sent()),
                text: format!("{edited_note}{}", result.text),
            })
        };
        // R7: recording an answered (or unsent) write clears the fence in the same update.
        let clear_fence = is_write && !uncertain;
        match self.record(segment, body, clear_fence, None).await {
            Recorded::Stored => {}
            Recorded::LostRun => return Err(Outcome::LeaseLost),
            Recorded::Failed(error) if is_write => {
                // R8: a write step that cannot be recorded stops the run; its fence stays.
                let reason = format!("a write step could not be recorded: {error}");
                return Err(self.unrecorded_write(segment, tool.effect, reason).await);
            }
            Recorded::Failed(error) => {
                tracing::warn!(run = %segment.run.id, %error, "could not record a read-only tool step; going on");
            }
        }
        if result.outcome == ToolOutcome::Cancelled {
            // M12: the model would read this, but the run itself is what was cancelled.
            let stop = self.must_stop(segment).await.unwrap_or(Outcome::Cancelled);
            self.observe_cancel(segment, returned, stop);
            return Err(stop);
        }
        if uncertain && tool.effect == Effect::NonIdempotentWrite {
            // R11, R12: nothing re-sends it; the run parks until a person says what it did.
            let message = uncertain_reason(&call.name, &result.text);
            return Err(self
                .ask(
                    segment,
                    DecisionKind::EffectUncertain,
                    round,
                    call,
                    Question::said(message),
                )
                .await);
        }
        let is_error = !result.is_success();
        Ok(answer(format!("{edited_note}{}", result.text), is_error))
    }

    /// R12: asks an operator about one tool call. The decision, its `decision_asked` step
    /// and (for the kinds that park) the run's move to `waiting_for_approval` with its
    /// lease released are one guarded transaction; the segment then ends
    /// `waiting_for_approval`, holding no slot. Approvals expire after the tool's timeout;
    /// an uncertain effect waits for a person however long it takes (nothing else may say
    /// what it did).
    async fn ask(
        &self,
        segment: &Segment<'_>,
        kind: DecisionKind,
        round: u32,
        call: &ToolCallRequest,
        question: Question,
    ) -> Outcome {
        let Question {
            message,
            requested_schema,
            reissue,
        } = question;
        let now = now_ms();
        let timeout = segment
            .agent
            .tools
            .iter()
            .find(|t| t.spec.name == call.name)
            .and_then(|t| t.approval)
            .unwrap_or(crate::decision::DEFAULT_APPROVAL_TIMEOUT);
        let expires_ms = match kind {
            DecisionKind::EffectUncertain => i64::MAX,
            _ => now.saturating_add(ms(timeout)),
        };
        let decision = Decision {
            id: uuid::Uuid::now_v7().to_string(),
            run_id: segment.run.id.clone(),
            kind,
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
            arguments_hash: arguments_hash(&call.arguments),
            message,
            requested_schema,
            asked_ms: now,
            expires_ms,
            status: DecisionStatus::Pending,
            answer: None,
            reason: None,
            answer_arguments: None,
            content: None,
            actor: None,
            answered_ms: None,
            reissue,
        };
        let body = EventBody::DecisionAsked(DecisionAsked {
            decision_id: decision.id.clone(),
            kind,
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments_hash: decision.arguments_hash.clone(),
            expires_ms,
            reissue: decision.reissue.is_some(),
        });
        let payload = body.to_payload();
        let ask = DecisionAsk {
            decision,
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            event_payload: payload.clone(),
        };
        let decision_id = ask.decision.id.clone();
        match self.store.decision_ask(ask).await {
            Ok(Some(seq)) => {
                // O5: the question as an event of the run's span, and a log line.
                tracing::info!(run = %segment.run.id, decision = %decision_id, kind = kind.as_str(), tool = %call.name, "run parked for an operator decision");
                if let Some(observer) = &segment.observer {
                    observer(&RunEvent {
                        run_id: segment.run.id.clone(),
                        seq,
                        kind: body.kind().to_string(),
                        payload,
                        time_ms: now,
                    });
                }
                Outcome::WaitingForApproval
            }
            Ok(None) => self.must_stop(segment).await.unwrap_or(Outcome::LeaseLost),
            Err(error) => {
                // Nothing was asked. For an approval nothing was sent, so a retry is safe;
                // an uncertain write keeps its fence, so a retry dead-letters it (R9).
                let reason = format!("the operator decision could not be stored: {error}");
                self.fail(segment, reason, true).await
            }
        }
    }

    /// R8: a write reached the server but its step is not in the log. A non-idempotent one
    /// may never run again: the run fails with its fence in place, so no path (a retry,
    /// the reaper) re-sends it. An idempotent one may: the run is retried.
    async fn unrecorded_write(
        &self,
        segment: &Segment<'_>,
        effect: Effect,
        reason: String,
    ) -> Outcome {
        if effect == Effect::NonIdempotentWrite {
            let reason = format!("{}: {reason}", DeadLetter::FencedWrite.as_str());
            self.settle(segment, RunState::Failed, reason).await
        } else {
            self.fail(segment, reason, true).await
        }
    }

    /// R7, R11: the gate the MCP client runs once the session is ready and before
    /// `tools/call` leaves: stamps the pending effect and renews the lease. A refusal (no
    /// lease, a cancelled run, a store failure) stops the call unsent and leaves what went
    /// wrong in `failure` for [`fence_failed`](Self::fence_failed).
    fn fence_gate(
        &self,
        segment: &Segment<'_>,
        tool: &BoundTool,
        failure: Arc<Mutex<Option<FenceFailure>>>,
    ) -> CallGate {
        let store = self.store.clone();
        let (id, owner) = (segment.run.id.clone(), self.config.owner.clone());
        let epoch = segment.run.claim_epoch;
        let (effect, lease) = (tool.effect.as_str().to_string(), self.config.lease);
        CallGate::new(move || {
            let (store, failure) = (store.clone(), failure.clone());
            let now = now_ms();
            let mark = FenceMark {
                id: id.clone(),
                owner: owner.clone(),
                epoch,
                effect: effect.clone(),
                lease_until_ms: now + ms(lease),
                now_ms: now,
            };
            Box::pin(async move {
                let refused = match store.run_fence_mark(mark).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => FenceFailure::NoLease,
                    Err(error) => FenceFailure::Store(error),
                };
                let reason = refused.to_string();
                *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(refused);
                Err(reason)
            })
        })
    }

    /// Ends the segment after the fence could not be stamped; the write was not sent.
    async fn fence_failed(&self, segment: &Segment<'_>, failure: FenceFailure) -> Outcome {
        match failure {
            FenceFailure::NoLease => self.must_stop(segment).await.unwrap_or(Outcome::LeaseLost),
            FenceFailure::Store(error) => {
                // Without the mark the write would be unfenced: it was refused (fail
                // closed). Nothing was sent, so a retry is safe.
                tracing::error!(run = %segment.run.id, %error, "could not stamp the write fence; the write was not made");
                self.fail(
                    segment,
                    format!("the write fence could not be stamped: {error}"),
                    true,
                )
                .await
            }
        }
    }
}

/// Why the write fence was not stamped.
enum FenceFailure {
    /// The segment no longer holds the run (its lease was lost or it was cancelled).
    NoLease,
    /// The store failed.
    Store(StoreError),
}

impl std::fmt::Display for FenceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoLease => {
                f.write_str("the run's lease is no longer held, so the write fence was not stamped")
            }
            Self::Store(error) => write!(f, "the write fence could not be stamped: {error}"),
        }
    }
}

/// The termination reason of a run stopped by an uncertain write (R11).
fn uncertain_reason(tool: &str, text: &str) -> String {
    format!(
        "{EFFECT_UNCERTAIN}: the non-idempotent write {tool} may have reached the server and no answer came back, so it will not be retried; check the server, then start a new run if needed ({text})"
    )
}

/// L4: why a recorded model turn cannot be acted upon, as the run's termination reason:
/// a turn cut by the output limit (never a final answer, its tool calls never run), or a
/// turn with neither text nor tool calls that the model ended for a reason other than a
/// natural stop (`content_filter`, `refusal`, an unknown one), which is no answer either.
/// R13: the budget's reason when a truncated turn went past the run's token total (the
/// call was capped by [`Executor::tokens_cap`]); `None` for a cut by the agent's limit.
fn truncated_by_budget(
    segment: &Segment<'_>,
    turn: &runwarden_models::ModelTurn,
) -> Option<String> {
    (turn.finish == Some(FinishReason::Length))
        .then(|| segment.budget.reason())
        .flatten()
}

fn unusable_turn(step: &ModelResponse, max_tokens: Option<u32>) -> Option<String> {
    let finish = step.finish.as_ref()?;
    if step.is_truncated() {
        let limit =
            max_tokens.map_or_else(|| "the provider's default".to_string(), |n| n.to_string());
        return Some(format!(
            "{MODEL_TRUNCATED}: the model hit its output limit (max_tokens = {limit}); raise max_tokens for the agent or ask for a shorter answer"
        ));
    }
    let empty = step.tool_calls.is_empty() && step.text.as_deref().is_none_or(str::is_empty);
    let natural = matches!(finish, FinishReason::Stop | FinishReason::ToolCalls);
    (empty && !natural).then(|| {
        format!(
            "{MODEL_NO_ANSWER}: the model ended its turn with finish reason {:?} and gave no answer",
            finish.as_str()
        )
    })
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

/// Where a run stands, rebuilt from its stored events.
struct Progress {
    /// The conversation so far.
    messages: Vec<Message>,
    /// The last model round that was recorded (0 for a fresh run).
    round: u32,
    /// Tool calls of that round with no recorded result.
    unanswered: Vec<ToolCallRequest>,
    /// The model's final answer, when its step is stored (R8: settle without the model).
    final_answer: Option<String>,
    /// A non-idempotent write whose effect is unknown and that no person has resolved
    /// yet (R11, R12).
    uncertain_write: Option<UncertainWrite>,
    /// R12: answered approvals, by the model's call id.
    approvals: HashMap<String, DecisionAnswered>,
    /// M19: answered `input` decisions whose call is re-issued, by call id (decision id).
    inputs: HashMap<String, String>,
    /// M19: the ids of `input` decisions asked by an `input_required` result.
    reissue_asked: std::collections::HashSet<String>,
    /// Why the run must fail: its last model turn was cut or empty (L4).
    unusable_turn: Option<String>,
    /// What the run spent so far (R13).
    spent: Spent,
    /// The run's end, when its terminal step is stored.
    terminal: Option<(RunState, String)>,
}

impl Progress {
    /// Rebuilds where the run stands. An event that cannot be read is an error naming the
    /// run and its sequence: nothing is guessed (a guess could repeat a write).
    fn replay(
        prompt: &str,
        history: &[RunEvent],
        max_tokens: Option<u32>,
    ) -> Result<Self, EventDecodeError> {
        let user = Message::User {
            text: prompt.to_string(),
        };
        let mut progress = Self {
            messages: vec![user],
            round: 0,
            unanswered: Vec::new(),
            final_answer: None,
            uncertain_write: None,
            unusable_turn: None,
            terminal: None,
            spent: Spent::default(),
            approvals: HashMap::new(),
            inputs: HashMap::new(),
            reissue_asked: std::collections::HashSet::new(),
        };
        for event in history {
            let body = EventBody::decode(&event.run_id, event.seq, &event.kind, &event.payload)?;
            match body {
                EventBody::ModelResponse(step) => {
                    progress.round = step.round;
                    progress.spent.output_tokens = progress
                        .spent
                        .output_tokens
                        .saturating_add(step.usage.map_or(0, |u| u.output_tokens));
                    if let Some(reason) = unusable_turn(&step, max_tokens) {
                        // L4: neither an answer nor tool calls to finish.
                        progress.unusable_turn = Some(reason);
                        progress.unanswered = Vec::new();
                        continue;
                    }
                    if step.tool_calls.is_empty() {
                        progress.final_answer = Some(step.text.clone().unwrap_or_default());
                    }
                    progress.messages.push(Message::Assistant {
                        text: step.text,
                        tool_calls: step.tool_calls.clone(),
                    });
                    progress.unanswered = step.tool_calls;
                }
                EventBody::ToolExecuted(step) => {
                    if !matches!(step.outcome, StepOutcome::Refused | StepOutcome::Denied) {
                        progress.spent.tool_calls = progress.spent.tool_calls.saturating_add(1);
                    }
                    progress.answered(&step.call_id, step.tool, step.text, step.outcome);
                }
                EventBody::EffectUncertain(step) => {
                    progress.spent.tool_calls = progress.spent.tool_calls.saturating_add(1);
                    let call = progress.unanswered.iter().find(|c| c.id == step.call_id);
                    if let (Effect::NonIdempotentWrite, Some(call)) = (step.effect, call) {
                        progress.uncertain_write = Some(UncertainWrite {
                            call: call.clone(),
                            round: step.round,
                            reason: uncertain_reason(&step.tool, &step.text),
                            asked: false,
                        });
                    }
                    progress.answered(&step.call_id, step.tool, step.text, step.outcome);
                }
                EventBody::DecisionAsked(asked) => {
                    if asked.reissue {
                        progress.reissue_asked.insert(asked.decision_id.clone());
                    }
                    if let Some(uncertain) = progress.uncertain_write.as_mut()
                        && asked.kind == DecisionKind::EffectUncertain
                        && uncertain.call.id == asked.call_id
                    {
                        uncertain.asked = true;
                    }
                }
                EventBody::DecisionAnswered(answered) => progress.decided(answered),
                EventBody::RunCompleted(end) => {
                    progress.terminal = Some((RunState::Completed, end.reason));
                }
                EventBody::RunFailed(end) => {
                    progress.terminal = Some((RunState::Failed, end.reason));
                }
                EventBody::RunStarted(_)
                | EventBody::RunResumed(_)
                | EventBody::ModelCancelled(_)
                | EventBody::ModelFailed(_)
                | EventBody::RunRequeued(_)
                | EventBody::RunStopped(_)
                // Progress reports tell the operator, never the resumed run.
                | EventBody::ModelProgress(_)
                | EventBody::ToolProgress(_)
                | EventBody::ToolLog(_) => {}
            }
        }
        Ok(progress)
    }

    /// R12: an answer in the log. An approval's answer waits for its call; an uncertain
    /// write's answer becomes what the model reads about that call, and the run goes on.
    fn decided(&mut self, answered: DecisionAnswered) {
        match answered.kind {
            DecisionKind::Approval => {
                self.approvals.insert(answered.call_id.clone(), answered);
            }
            DecisionKind::EffectUncertain => {
                let text = match answered.answer {
                    Answer::Applied => {
                        "an operator confirmed that this call took effect; its result is unknown"
                    }
                    Answer::NotApplied => {
                        "an operator confirmed that this call did not take effect; nothing changed, so you may decide whether to make it again"
                    }
                    // A cancel ended the run in the answer's own transaction.
                    _ => return,
                };
                let is_error = answered.answer == Answer::NotApplied;
                for message in self.messages.iter_mut().rev() {
                    if let Message::Tool {
                        call_id,
                        content,
                        is_error: error,
                        ..
                    } = message
                        && *call_id == answered.call_id
                    {
                        *content = text.to_string();
                        *error = is_error;
                        break;
                    }
                }
                if self
                    .uncertain_write
                    .as_ref()
                    .is_some_and(|u| u.call.id == answered.call_id)
                {
                    self.uncertain_write = None;
                }
            }
            // M19: an answer to an `input_required` result waits for its call's re-issue;
            // an elicitation's answer went back to the server during its call.
            DecisionKind::Input => {
                if self.reissue_asked.contains(&answered.decision_id) {
                    self.inputs
                        .insert(answered.call_id.clone(), answered.decision_id.clone());
                }
            }
        }
    }

    /// A tool call of the last turn has its result in the log.
    fn answered(&mut self, call_id: &str, tool: String, text: String, outcome: StepOutcome) {
        self.unanswered.retain(|c| c.id != call_id);
        self.messages.push(Message::Tool {
            call_id: call_id.to_string(),
            name: tool,
            content: text,
            is_error: outcome != StepOutcome::Succeeded,
        });
    }
}

/// What a decision asks beyond its call (R12).
#[derive(Default)]
struct Question {
    /// For people: what went wrong, or the server's question.
    message: Option<String>,
    /// Input: the schema the answer's content must match.
    requested_schema: Option<Value>,
    /// M19: how to re-issue the call once answered (an `input_required` result).
    reissue: Option<crate::decision::Reissue>,
}

impl Question {
    fn said(message: String) -> Self {
        Self {
            message: Some(message),
            ..Self::default()
        }
    }
}

/// A non-idempotent write of the log whose effect is unknown (R11).
#[derive(Clone)]
struct UncertainWrite {
    /// The model's call, as it asked for it.
    call: ToolCallRequest,
    /// Its round.
    round: u32,
    /// Why the run stops, for people (and the decision's message).
    reason: String,
    /// Whether a decision about it was asked (R12).
    asked: bool,
}

/// What a requeue's answer means for the segment.
fn requeue_outcome(answer: RequeueAnswer) -> Outcome {
    match answer {
        RequeueAnswer::Requeued { .. } => Outcome::Requeued,
        RequeueAnswer::DeadLettered(_) => Outcome::DeadLettered,
        RequeueAnswer::AlreadyCancelled => Outcome::Cancelled,
        RequeueAnswer::LeaseLost => Outcome::LeaseLost,
    }
}

impl Recorded {
    fn is_lost(&self) -> bool {
        matches!(self, Self::LostRun)
    }
}
