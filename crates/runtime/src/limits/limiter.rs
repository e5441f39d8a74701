//! Taking a call's limits, and waiting for them: woken by a release in this process, a
//! bounded poll for releases elsewhere and the bucket's own refill time, stopped by the
//! run's cancel or the wait's bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_vault::CancellationSignal;
use tokio::sync::Notify;

use super::config::{Limit, LimitKey, Limits};
use super::hold::Hold;
use super::store::{LimitStore, LimitTake};
use crate::rules::limits::TakeDecision;
use crate::time::{ms, now_ms};

/// How often a waiter for a concurrency limit looks again when nothing woke it: the bound
/// on noticing a slot freed by another process.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);

/// Sees waits begin and end (the binary's metrics).
pub trait LimitObserver: Send + Sync {
    /// A call began to wait.
    fn wait_began(&self);
    /// A wait ended, after `waited`.
    fn wait_ended(&self, end: WaitEnd, waited: Duration);
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The call took its limits.
    Taken,
    /// The wait reached its bound.
    TimedOut,
    /// The run was cancelled (or must stop).
    Cancelled,
    /// The store could not be asked.
    Unavailable,
}

impl WaitEnd {
    /// The word the event and the metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Taken => "taken",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Unavailable => "unavailable",
        }
    }
}

/// The limits one call is subject to, in the order they are taken.
#[derive(Debug, Clone)]
pub struct LimitPlan {
    limits: Vec<(LimitKey, Limit)>,
}

impl LimitPlan {
    /// True when the call is subject to no limit.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The longest the call waits: the least `max_wait` of its limits.
    pub fn max_wait(&self) -> Duration {
        self.limits
            .iter()
            .map(|(_, l)| l.max_wait)
            .min()
            .unwrap_or_default()
    }
}

/// A limit that was full when the call asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Full {
    /// Which limit.
    pub key: LimitKey,
    /// What it allows.
    pub limit: Limit,
    /// For a rate limit, when its next token comes; `None` for a concurrency limit.
    pub retry_in: Option<Duration>,
}

impl Full {
    /// `rate limit of server tickets (10 per second)`, `concurrency limit of tool
    /// t__x (4 at once)`.
    pub fn describe(&self) -> String {
        match (self.retry_in, self.limit.rule.concurrency) {
            (None, Some(k)) => format!("concurrency limit of {} ({k} at once)", self.key),
            _ => {
                let rate = self.limit.rule.rate_per_second.unwrap_or_default();
                format!("rate limit of {} ({rate} per second)", self.key)
            }
        }
    }
}

/// One attempt's answer.
#[derive(Debug)]
pub enum TakeAttempt {
    /// Every limit taken.
    Taken(Hold),
    /// One was full; nothing was taken.
    Full(Full),
}

/// Why a call did not get its limits. Its text is what the model reads as the tool's
/// error: nothing was sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitStop {
    /// The run was cancelled, or must stop, while the call waited.
    #[error("the call was stopped while it waited for the {}", .0.describe())]
    Cancelled(Full),
    /// The wait reached its bound.
    #[error("{}: waited {}s, try again later", .full.describe(), .waited.as_secs())]
    TimedOut {
        /// The limit that stayed full.
        full: Full,
        /// How long the call waited.
        waited: Duration,
    },
    /// The store could not be asked; nothing was sent.
    #[error("could not check the limits of this call ({0}); nothing was sent, try again later")]
    Unavailable(String),
}

/// Takes calls' limits through the store, shared by every run of the process.
pub struct Limiter {
    /// The limits in force; a reload swaps them, and a call plans with those it reads.
    limits: std::sync::RwLock<Arc<Limits>>,
    store: Arc<dyn LimitStore>,
    /// Woken when a hold of this process is released.
    released: Arc<Notify>,
    poll: Duration,
    observer: Option<Arc<dyn LimitObserver>>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("limits", &self.limits())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter over `limits`, kept in `store`.
    pub fn new(limits: Limits, store: Arc<dyn LimitStore>) -> Self {
        Self {
            limits: std::sync::RwLock::new(Arc::new(limits)),
            store,
            released: Arc::new(Notify::new()),
            poll: DEFAULT_POLL,
            observer: None,
        }
    }

    /// Reports waits to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn LimitObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Looks again this often for slots freed elsewhere.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `limits` in force for the calls that plan from now on (a reload). A call that
    /// already holds its limits keeps them until it releases them.
    pub fn set_limits(&self, limits: Limits) {
        *self
            .limits
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(limits);
    }

    /// The plan of a tool call (see [`Limits::for_tool`]).
    pub fn for_tool(
        &self,
        agent: &str,
        token: Option<&str>,
        server: &str,
        tool: &str,
    ) -> LimitPlan {
        LimitPlan {
            limits: self.limits().for_tool(agent, token, server, tool),
        }
    }

    /// The plan of a model call (see [`Limits::for_model`]).
    pub fn for_model(&self, agent: &str, token: Option<&str>) -> LimitPlan {
        LimitPlan {
            limits: self.limits().for_model(agent, token),
        }
    }

    /// One try at every limit of `plan`, all or none. A plan with no limit takes nothing
    /// and never touches the store.
    pub async fn try_take(&self, plan: &LimitPlan) -> Result<TakeAttempt, LimitStop> {
        if plan.is_empty() {
            return Ok(TakeAttempt::Taken(Hold::nothing()));
        }
        let holder = uuid::Uuid::now_v7().to_string();
        let now = now_ms();
        let lease = self.limits().hold_lease();
        let params = LimitTake {
            holder: holder.clone(),
            limits: plan
                .limits
                .iter()
                .map(|(k, l)| (k.stored(), l.rule))
                .collect(),
            now_ms: now,
            hold_until_ms: now + ms(lease),
        };
        let decision = self
            .store
            .limit_take(params)
            .await
            .map_err(|e| LimitStop::Unavailable(e.to_string()))?;
        match decision {
            TakeDecision::Take { holds, .. } if holds.is_empty() => {
                Ok(TakeAttempt::Taken(Hold::nothing()))
            }
            TakeDecision::Take { .. } => Ok(TakeAttempt::Taken(Hold::slots(
                holder,
                self.store.clone(),
                self.released.clone(),
                lease,
            ))),
            TakeDecision::Wait { key, retry_in_ms } => {
                let (key, limit) = plan
                    .limits
                    .iter()
                    .find(|(k, _)| k.stored() == key)
                    .cloned()
                    .ok_or_else(|| {
                        LimitStop::Unavailable(format!(
                            "the store named a limit {key:?} the call does not have"
                        ))
                    })?;
                Ok(TakeAttempt::Full(Full {
                    key,
                    limit,
                    retry_in: retry_in_ms.map(|m| Duration::from_millis(m.max(1) as u64)),
                }))
            }
        }
    }

    /// Waits until every limit of `plan` is taken, after `full` answered the first try:
    /// at most the plan's `max_wait`, and no longer than the signal stays uncancelled.
    pub async fn wait(
        &self,
        plan: &LimitPlan,
        mut full: Full,
        signal: &dyn CancellationSignal,
    ) -> Result<Hold, LimitStop> {
        let started = Instant::now();
        let deadline = started + plan.max_wait();
        if let Some(observer) = &self.observer {
            observer.wait_began();
        }
        let result = loop {
            let now = Instant::now();
            if signal.is_cancelled() {
                break Err(LimitStop::Cancelled(full));
            }
            if now >= deadline {
                break Err(LimitStop::TimedOut {
                    full,
                    waited: now - started,
                });
            }
            let nap = full.retry_in.unwrap_or(self.poll).min(deadline - now);
            tokio::select! {
                () = self.released.notified() => {}
                () = tokio::time::sleep(nap) => {}
                () = signal.woken() => {}
            }
            if signal.is_cancelled() {
                break Err(LimitStop::Cancelled(full));
            }
            match self.try_take(plan).await {
                Ok(TakeAttempt::Taken(hold)) => break Ok(hold),
                Ok(TakeAttempt::Full(again)) => full = again,
                Err(stop) => break Err(stop),
            }
        };
        if let Some(observer) = &self.observer {
            let end = match &result {
                Ok(_) => WaitEnd::Taken,
                Err(LimitStop::TimedOut { .. }) => WaitEnd::TimedOut,
                Err(LimitStop::Cancelled(_)) => WaitEnd::Cancelled,
                Err(LimitStop::Unavailable(_)) => WaitEnd::Unavailable,
            };
            observer.wait_ended(end, started.elapsed());
        }
        result
    }
}
