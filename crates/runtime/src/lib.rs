//! Durable agent runs: the run store seam, the step loop over models and MCP tools,
//! cancellation at step boundaries and in flight, and the write fence.
//!
//! An [`Executor`] creates and executes runs held in a [`RunStore`]. Each outbound call
//! of a run carries a [`RunSignal`] from the process's one [`StatusWatcher`], which reads
//! the statuses of every in-flight run in one batched query per interval and answers
//! "cancelled?" from memory; an operator's cancel ([`cancel_run`], through
//! [`Executor::cancel`]) wakes the watcher via the [`CancelHub`], and the store's change
//! feed wakes it for cancels made elsewhere. One function, `is_run_cancelled` in
//! `signal.rs`, defines cancelled. Outcomes are values
//! ([`Outcome`]), never errors. Each step is stored as a typed, versioned [`EventBody`],
//! and resumption refuses an event it cannot read. Whether a run goes back to the queue or
//! is dead-lettered is decided here ([`RetryPolicy::decide`]); a [`QueueStore`] only
//! applies the decision under a guard. The crate contains no SQL.
//!
//! ```no_run
//! # async fn example(executor: runwarden_runtime::Executor, agent: runwarden_runtime::AgentSpec) {
//! let run = executor.create_sync(&agent.name, "file a ticket for the printer").await.unwrap();
//! let outcome = executor.execute(&run, &agent, "file a ticket for the printer", None).await;
//! println!("{} {}", run.id, outcome.as_str());
//! # }
//! ```

#![deny(missing_docs)]

mod agent;
mod budget;
mod cancel;
mod decide;
pub mod decision;
mod elicitor;
pub mod events;
mod executor;
pub mod feed;
pub mod gateway;
pub mod idempotency;
pub mod limits;
pub mod migrations;
mod observer;
mod one_truth;
mod progress;
pub mod queue;
mod requeue;
mod retry;
pub mod rules;
mod schema_check;
mod signal;
mod state;
pub mod store;
mod store_state;
mod time;
mod tool_notices;
mod uncertain;
mod watcher;
mod worker;

pub use agent::{AgentSpec, BoundTool, bind_tools, clamp_rounds, pattern_matches};
pub use budget::{BudgetAboveAgent, Budgets};
pub use cancel::{CancelRefused, Canceller, cancel_run};
pub use decide::{AnswerRequest, DecideError, decide, expire_due};
pub use decision::{
    Answer, AnswerOutcome, AnswerRefusal, Decision, DecisionFilter, DecisionKind, DecisionStatus,
};
pub use elicitor::RunElicitor;
pub use events::{EventBody, usage_of};
pub use executor::{CancelLatencyObserver, Executor, ExecutorConfig, SegmentOptions, run_request};
pub use feed::{Change, ChangeFeed};
pub use idempotency::IDEMPOTENCY_RETENTION_MS;
pub use observer::Observer;
pub use one_truth::check_row_matches_log;
pub use queue::{QueueStore, RequeueAnswer, WORKER_FORGOTTEN_AFTER_MS};
pub use requeue::{reap, reap_at};
pub use retry::{DeadLetter, RequeueCause, RetryDecision, RetryPolicy};
pub use signal::{CancelHub, RunSignal};
pub use state::{EFFECT_UNCERTAIN, Outcome, RunState};
pub use store::{
    CancelAnswer, KeyedCreate, Run, RunCreateKeyed, RunEvent, RunFilter, RunOrigin, RunStore,
};
pub use store_state::{observe_store_call, report_store_state, store_state_changes};
pub use uncertain::{after_reread, outcome_unknown};
pub use watcher::{DEFAULT_WATCH_INTERVAL, StatusWatcher, WatcherConfig};
pub use worker::{
    AgentError, AgentSource, OutcomeObserver, StopLevel, WORKER_BEAT, Worker, WorkerConfig,
    WorkerSummary,
};
