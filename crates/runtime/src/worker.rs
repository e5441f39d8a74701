//! Workers (R3, R9): claim queued runs, execute them on the shared executor, reap the runs
//! of dead workers, and stop gracefully.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::{Semaphore, watch};

use crate::agent::AgentSpec;
use crate::events::{EventBody, RunEnded};
use crate::executor::{Executor, SegmentOptions};
use crate::feed::Change;
use crate::queue::{Claim, Claimed, QueueStore, RequeueAnswer};
use crate::requeue::{apply_held, decide_held, reap};
use crate::retry::{RequeueCause, RetryPolicy};
use crate::state::{Outcome, RunState};
use crate::store::{EventAppend, Run, RunEnd, RunEvent};
use crate::time::now_ms;
use runwarden_vault::store::{StoreError, StoreFault};

/// How often a worker writes its presence row; a worker not seen for three beats is
/// taken to be gone (`enqueue` says so).
pub const WORKER_BEAT: Duration = Duration::from_secs(5);

/// The most runs one claim takes, when as many slots are free: a worker's first claim,
/// or several segments that ended together. One transaction holds the write lock for
/// all of them.
const CLAIM_AT_ONCE: usize = 16;

/// Builds the agent a queued run names, when a worker claims it.
#[async_trait]
pub trait AgentSource: Send + Sync {
    /// The agent, or why it cannot run now: [`AgentError::Invalid`] dead-letters the run as
    /// not retryable, [`AgentError::Unavailable`] hands it back to the queue.
    async fn agent(&self, name: &str) -> Result<AgentSpec, AgentError>;

    /// The names of the agents this source can build, read at each claim, so a worker
    /// never claims a run of an agent it does not know; `None` (the default) claims runs
    /// of any agent.
    fn names(&self) -> Option<Vec<String>> {
        None
    }
}

/// Why a worker could not build a claimed run's agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The configuration cannot run it (an unknown agent, a tool pattern that matches no
    /// imported tool): a retry would fail the same way, so the run is dead-lettered
    /// `NOT_RETRYABLE`.
    #[error("{0}")]
    Invalid(String),
    /// Something the agent needs is unavailable for now (the store is locked or full, the
    /// process ran out of file descriptors): the run goes back to the queue with a
    /// backoff, without spending its retry budget, and is never dead-lettered for it.
    #[error("{0}")]
    Unavailable(String),
}

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Runs executed at once.
    pub concurrency: usize,
    /// O6: an idle worker is woken by the store's change feed (`Change::Ready`, or a
    /// `Resync`); this is only the backstop for what cannot wake it, such as a run
    /// requeued with a `retry_at` that has since come due.
    pub poll: Duration,
    /// How often the reaper runs inside the worker.
    pub reap_every: Duration,
    /// Retries of retryable failures, and the budget the reaper shares.
    pub retry: RetryPolicy,
    /// How long a graceful stop waits for running segments to reach a boundary.
    pub grace: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            poll: Duration::from_secs(1),
            reap_every: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            grace: Duration::from_secs(30),
        }
    }
}

/// How far a stop has gone: the first request drains, the second stops at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopLevel {
    /// Keep working.
    Run,
    /// Stop claiming; running segments hand their runs back at their next boundary.
    Drain,
    /// Exit now; leases run out and the reaper recovers the runs.
    Now,
}

/// What a worker did, for its exit line.
#[derive(Debug, Default)]
pub struct WorkerSummary {
    /// Segments started.
    pub claimed: usize,
    /// Segments that ended with each outcome, as (outcome, count).
    pub outcomes: Vec<(Outcome, usize)>,
    /// Runs the reaper requeued or dead-lettered.
    pub rescued: usize,
    /// Segments still running when the worker exited.
    pub abandoned: usize,
}

/// Sees each segment's run and outcome as it ends (the CLI prints a progress line).
pub type OutcomeObserver = Arc<dyn Fn(&Run, Outcome) + Send + Sync>;

/// A worker process's loop.
pub struct Worker {
    executor: Arc<Executor>,
    queue: Arc<dyn QueueStore>,
    agents: Arc<dyn AgentSource>,
    config: WorkerConfig,
    observer: Option<OutcomeObserver>,
    /// Segments executing now (O5: the process's busy slots).
    busy: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner", &self.executor.owner())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Returns when the feed says a run may have become claimable: `Ready`, a `Resync` (a
/// change this process cannot name, such as an enqueue by another process on the same
/// SQLite file), or a lag. Other changes are skipped. A closed feed never returns; the
/// backstop then does the work.
async fn ready(feed: &mut broadcast::Receiver<Change>) {
    loop {
        match feed.recv().await {
            Ok(Change::Ready | Change::Resync) | Err(RecvError::Lagged(_)) => return,
            Ok(_) => continue,
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

impl Worker {
    /// A worker executing on `executor` (built with [`Executor::with_queue`]).
    pub fn new(
        executor: Arc<Executor>,
        queue: Arc<dyn QueueStore>,
        agents: Arc<dyn AgentSource>,
        config: WorkerConfig,
    ) -> Self {
        Self {
            executor,
            queue,
            agents,
            config,
            observer: None,
            busy: Arc::default(),
        }
    }

    /// How many of this worker's slots execute a segment now, kept current as segments
    /// start and end (a metrics gauge reads it).
    pub fn busy_slots(&self) -> Arc<AtomicUsize> {
        self.busy.clone()
    }

    /// Calls `observer` as each segment ends.
    pub fn with_observer(mut self, observer: OutcomeObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Claims and executes runs until `stop` says otherwise.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<StopLevel>) -> WorkerSummary {
        let drain = Arc::new(AtomicBool::new(false));
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let rescued = Arc::new(AtomicUsize::new(0));
        let reaper = self.clone().spawn_reaper(rescued.clone());
        // Seen before the first claim: whoever sees a run claimed also sees a worker.
        self.beat().await;
        let presence = self.clone().spawn_presence();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
        let mut summary = WorkerSummary::default();
        let mut running = 0usize;
        let mut outcomes: Vec<Outcome> = Vec::new();
        // O6: subscribed before the first claim, so a run enqueued after it wakes us.
        let mut feed = self.queue.change_feed().subscribe();

        while *stop.borrow() == StopLevel::Run {
            let permit = tokio::select! {
                permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                _ = stop.changed() => continue,
                Some(outcome) = done_rx.recv() => { running -= 1; outcomes.push(outcome); continue; }
            };
            // Every slot free now claims in the same trip to the store.
            let mut free = vec![permit];
            while free.len() < CLAIM_AT_ONCE
                && let Ok(permit) = permits.clone().try_acquire_owned()
            {
                free.push(permit);
            }
            let claim = Claim {
                owner: self.executor.owner().to_string(),
                lease_until_ms: now_ms() + self.executor.lease_ms(),
                now_ms: now_ms(),
                agents: self.agents.names(),
                start: true,
            };
            match self.claim(claim, free.len()).await {
                Ok(claimed) if !claimed.is_empty() => {
                    for (claimed, permit) in claimed.into_iter().zip(free) {
                        summary.claimed += 1;
                        running += 1;
                        self.start_segment(claimed, permit, &drain, &done_tx);
                    }
                }
                Ok(_) => {
                    drop(free);
                    self.idle(
                        &mut feed,
                        &mut stop,
                        &mut done_rx,
                        &mut running,
                        &mut outcomes,
                    )
                    .await;
                }
                Err(error) => {
                    drop(free);
                    tracing::warn!(%error, "could not claim a run; trying again");
                    // A failing store is not hammered: only the backstop retries the claim.
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.poll) => {}
                        _ = stop.changed() => {}
                        Some(outcome) = done_rx.recv() => { running -= 1; outcomes.push(outcome); }
                    }
                }
            }
        }

        // Graceful stop: segments hand their runs back at their next boundary.
        drain.store(true, Ordering::SeqCst);
        let deadline = tokio::time::sleep(self.config.grace);
        tokio::pin!(deadline);
        while running > 0 {
            tokio::select! {
                Some(outcome) = done_rx.recv() => { running -= 1; outcomes.push(outcome); }
                _ = &mut deadline => break,
                _ = stop.changed() => if *stop.borrow() == StopLevel::Now { break },
            }
        }
        reaper.abort();
        presence.abort();
        summary.abandoned = running;
        summary.rescued = rescued.load(Ordering::SeqCst);
        for outcome in outcomes {
            match summary.outcomes.iter_mut().find(|(o, _)| *o == outcome) {
                Some((_, n)) => *n += 1,
                None => summary.outcomes.push((outcome, 1)),
            }
        }
        summary
    }

    /// Runs a claimed run's segment on its own task, holding its slot until it ends.
    fn start_segment(
        self: &Arc<Self>,
        Claimed {
            run,
            history,
            started,
        }: Claimed,
        permit: tokio::sync::OwnedSemaphorePermit,
        drain: &Arc<AtomicBool>,
        done: &tokio::sync::mpsc::UnboundedSender<Outcome>,
    ) {
        // O5: every claim, and below every segment's end, in the log.
        tracing::info!(run = %run.id, agent = %run.agent, owner = %self.executor.owner(), "claimed a run");
        let (worker, drain, done) = (self.clone(), drain.clone(), done.clone());
        self.busy.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let outcome = worker.segment(run.clone(), history, started, drain).await;
            worker.busy.fetch_sub(1, Ordering::SeqCst);
            tracing::info!(run = %run.id, outcome = outcome.as_str(), "a run's segment ended");
            if let Some(observer) = &worker.observer {
                observer(&run, outcome);
            }
            drop(permit);
            let _ = done.send(outcome);
        });
    }

    /// One claim of up to `max` runs, bounded by half a lease so a store that hangs cannot
    /// stop the loop. A claim abandoned at the bound may have been stored: it is not acted
    /// on, its lease runs out and the reaper hands the run back.
    async fn claim(&self, claim: Claim, max: usize) -> Result<Vec<Claimed>, StoreError> {
        let bound = std::time::Duration::from_millis(
            u64::try_from(self.executor.lease_ms() / 2)
                .unwrap_or(0)
                .max(1),
        );
        tokio::time::timeout(bound, self.queue.run_claim_many(claim, max))
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::with_fault(
                    "claiming a queued run",
                    StoreFault::Io,
                    format!(
                        "the store did not answer within {bound:?}; a claim it may have \
                         stored is not acted on and goes back to the queue when its lease runs out"
                    ),
                ))
            })
    }

    /// Nothing to claim: waits for news that a run may be claimable (O6: `Ready`, a
    /// `Resync`, or a lag), a stop, a finished segment, or the backstop.
    async fn idle(
        &self,
        feed: &mut broadcast::Receiver<Change>,
        stop: &mut watch::Receiver<StopLevel>,
        done: &mut tokio::sync::mpsc::UnboundedReceiver<Outcome>,
        running: &mut usize,
        outcomes: &mut Vec<Outcome>,
    ) {
        let backstop = tokio::time::sleep(self.config.poll);
        tokio::pin!(backstop);
        tokio::select! {
            () = ready(feed) => {
                // Several enqueues in a burst are one wake: the claim loop takes runs
                // until none is left.
                while let Ok(_) | Err(TryRecvError::Lagged(_)) = feed.try_recv() {}
            }
            _ = &mut backstop => {}
            _ = stop.changed() => {}
            Some(outcome) = done.recv() => { *running -= 1; outcomes.push(outcome); }
        }
    }

    /// Beats this worker's presence row every [`WORKER_BEAT`], from the start, so
    /// `enqueue` can tell when no worker is there to claim a run.
    fn spawn_presence(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let start = tokio::time::Instant::now() + WORKER_BEAT;
            let mut tick = tokio::time::interval_at(start, WORKER_BEAT);
            loop {
                tick.tick().await;
                self.beat().await;
            }
        })
    }

    /// Writes this worker's presence row now.
    async fn beat(&self) {
        if let Err(error) = self
            .queue
            .worker_seen(self.executor.owner(), now_ms())
            .await
        {
            tracing::warn!(%error, "could not record this worker's presence");
        }
    }

    fn spawn_reaper(self: Arc<Self>, rescued: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.config.reap_every);
            loop {
                tick.tick().await;
                // Bounded, so one pass stuck in the store cannot stop the later ones.
                let pass = tokio::time::timeout(
                    self.config.reap_every.max(Duration::from_secs(5)),
                    reap(&*self.queue, &self.config.retry),
                );
                match pass.await.unwrap_or_else(|_| {
                    Err(StoreError::with_fault(
                        "reaping stale runs",
                        StoreFault::Io,
                        "the store did not answer in time; the next pass tries again",
                    ))
                }) {
                    Ok(done) => {
                        for rescued_run in &done {
                            tracing::info!(run = %rescued_run.id, action = ?rescued_run.action, "the reaper recovered a stale run");
                        }
                        rescued.fetch_add(done.len(), Ordering::SeqCst);
                    }
                    Err(error) => tracing::warn!(%error, "the reaper could not run"),
                }
                // R12: approvals whose time is up are denied as "expired"; the runs go
                // back to the queue, which wakes a worker.
                match crate::decide::expire_due(&*self.queue, now_ms()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(expired = n, "operator decisions expired"),
                    Err(error) => tracing::warn!(%error, "could not expire operator decisions"),
                }
                // Keeps the changes a store holds per ended run few, scraped or not. One
                // that fails is moved by the next pass or scrape; the counts stay right.
                if let Err(error) = self.queue.run_counts_fold().await {
                    tracing::debug!(%error, "run counts not folded; the next pass tries again");
                }
            }
        })
    }

    /// One claimed run, from its stored request to an outcome.
    async fn segment(
        &self,
        run: Run,
        history: Option<Vec<RunEvent>>,
        started: Option<RunEvent>,
        drain: Arc<AtomicBool>,
    ) -> Outcome {
        let prompt = crate::events::stored_prompt(&run).map(str::to_string);
        let agent = match (prompt.as_ref(), self.agents.agent(&run.agent).await) {
            (Some(_), Ok(agent)) => agent,
            (None, _) => {
                return self
                    .dead_letter(&run, "the run has no stored prompt".into())
                    .await;
            }
            (_, Err(AgentError::Invalid(problem))) => return self.dead_letter(&run, problem).await,
            (_, Err(AgentError::Unavailable(problem))) => {
                return self.hand_back(&run, problem).await;
            }
        };
        let options = SegmentOptions {
            retry: Some(self.config.retry),
            drain: Some(drain),
            history,
            started,
        };
        self.executor
            .execute_with(
                &run,
                &agent,
                prompt.as_deref().unwrap_or_default(),
                None,
                &options,
            )
            .await
    }

    /// R9: the run's agent cannot be built for a reason that heals (a store fault, too
    /// many open files). It goes back to the queue after a backoff, without spending the
    /// budget: the run did nothing, so it must not be dead-lettered for the environment.
    async fn hand_back(&self, run: &Run, problem: String) -> Outcome {
        let owner = self.executor.owner();
        let why = format!("waiting to retry: {problem}");
        let answer = match decide_held(
            &*self.queue,
            &self.config.retry,
            &run.id,
            (owner, run.claim_epoch),
            RequeueCause::Unavailable,
        )
        .await
        {
            Ok(Ok(decided)) => {
                tracing::warn!(run = %run.id, %problem, decision = ?decided.decision, "the run's agent cannot be built now; back to the queue");
                apply_held(&*self.queue, &decided, owner, &why).await
            }
            Ok(Err(answer)) => Ok(answer),
            Err(error) => Err(error),
        };
        match answer {
            Ok(RequeueAnswer::Requeued { .. }) => Outcome::Requeued,
            Ok(RequeueAnswer::DeadLettered(_)) => Outcome::DeadLettered,
            Ok(RequeueAnswer::AlreadyCancelled) => Outcome::Cancelled,
            Ok(RequeueAnswer::LeaseLost) => Outcome::LeaseLost,
            Err(error) => {
                // The store is still failing: the run keeps our lease until it runs out
                // and the reaper hands it back. That is neither a failure of the run nor
                // a cancellation.
                tracing::error!(run = %run.id, %error, "could not hand the run back; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }

    /// Dead-letters a run this worker cannot run at all; its `run_failed` step and its
    /// status go in one transaction, so the log says why.
    async fn dead_letter(&self, run: &Run, problem: String) -> Outcome {
        let reason = format!(
            "{}: {problem}",
            crate::retry::DeadLetter::NotRetryable.as_str()
        );
        let body = EventBody::RunFailed(RunEnded {
            reason: reason.clone(),
        });
        let append = EventAppend {
            id: run.id.clone(),
            owner: self.executor.owner().to_string(),
            epoch: run.claim_epoch,
            kind: body.kind().to_string(),
            payload: body.to_payload(),
            clear_fence: false,
            round: None,
            end: Some(RunEnd {
                status: RunState::Failed,
                reason,
            }),
            now_ms: now_ms(),
            before: None,
        };
        match self.queue.run_event_append(append).await {
            Ok(Some(_)) => Outcome::DeadLettered,
            Ok(None) if crate::signal::is_run_cancelled(&*self.queue, &run.id).await => {
                // The cancel won the row: the segment that holds it records the stop.
                let stopped = EventBody::RunStopped(crate::events::RunStopped {
                    outcome: Outcome::Cancelled,
                    reason: None,
                });
                let append = EventAppend {
                    id: run.id.clone(),
                    owner: self.executor.owner().to_string(),
                    epoch: run.claim_epoch,
                    kind: stopped.kind().to_string(),
                    payload: stopped.to_payload(),
                    clear_fence: false,
                    round: None,
                    end: None,
                    now_ms: now_ms(),
                    before: None,
                };
                let _ = self.queue.run_event_append(append).await;
                Outcome::Cancelled
            }
            Ok(None) => Outcome::LeaseLost,
            Err(error) => {
                tracing::error!(run = %run.id, %error, "could not dead-letter the run; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }
}
