//! The events of a run's life outside its steps: started, resumed, requeued, ended, and
//! stopped (by a cancel that won the row, or found so by the reaper).

use serde::{Deserialize, Serialize};

use super::EventBody;
use crate::state::{Outcome, RunState};

/// `run_started`: the first segment of a run began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStarted {
    /// The agent's name.
    pub agent: String,
    /// The prompt the run was asked.
    pub prompt: String,
    /// The segment that holds the lease.
    pub owner: String,
}

impl RunStarted {
    /// The step a claim records for a queued run with no events yet, in the claim's
    /// transaction: the run's agent, its stored prompt and the claiming worker. `None`
    /// when the run has no stored prompt (the worker fails such a run instead).
    pub fn at_claim(run: &crate::store::Run, owner: &str) -> Option<EventBody> {
        Some(EventBody::RunStarted(Self {
            agent: run.agent.clone(),
            prompt: stored_prompt(run)?.to_string(),
            owner: owner.to_string(),
        }))
    }
}

/// The prompt a queued run was created with, from its stored request.
pub fn stored_prompt(run: &crate::store::Run) -> Option<&str> {
    run.request.as_ref().and_then(|r| r["prompt"].as_str())
}

/// `run_resumed`: a later segment picked up a run that has events (R9: resume, never
/// restart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResumed {
    /// The segment that holds the lease now.
    pub owner: String,
    /// The last model round found in the log.
    pub from_round: u32,
    /// Which attempt this is (the requeue count plus one).
    pub attempt: u32,
}

/// `run_requeued`: the segment handed its run back to the queue (R9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequeued {
    /// Why.
    pub reason: String,
    /// True when the requeue spends the retry budget (a failure, not a graceful stop).
    pub counts: bool,
    /// The backoff before the next attempt may start.
    pub retry_in_ms: u64,
}

/// `run_completed` and `run_failed`: the run's end (R8: final, never written twice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnded {
    /// The final answer, or why the run failed.
    pub reason: String,
}

/// `run_stopped`: a segment stopped without settling (R5: the cancel won the row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStopped {
    /// The segment's outcome.
    pub outcome: Outcome,
    /// Why, when the store wrote the stop with the status change because no segment
    /// held the run (cancelled while queued or while waiting for a decision); a
    /// segment's own stop has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// R8: the final event of a cancelled run whose segment died before it recorded its
/// stop; the reaper writes it once the lease has been over for [`ORPHAN_GRACE_MS`].
pub fn stopped_orphan() -> EventBody {
    EventBody::RunStopped(RunStopped {
        outcome: Outcome::Cancelled,
        reason: Some(
            "cancelled by an operator while running; the process running it ended before it recorded the stop"
                .into(),
        ),
    })
}

/// How long after a cancelled run's lease ran out the reaper takes its segment for dead
/// (a live segment renews the lease every heartbeat until it records its stop).
pub const ORPHAN_GRACE_MS: i64 = 60_000;

/// R8: the final event of a run cancelled from `previous`, written by the store in the
/// cancel's transaction when no segment holds the run to write its own `run_stopped`
/// (queued, or parked on a decision). `None` for a running run: its segment records the
/// stop at its boundary.
pub fn cancelled_from(previous: RunState, why: &str) -> Option<EventBody> {
    let where_ = match previous {
        RunState::Queued => {
            "while queued: no worker will take it up, and a retry it was waiting for will not happen"
        }
        RunState::WaitingForApproval => "while it waited for an operator decision",
        _ => return None,
    };
    Some(EventBody::RunStopped(RunStopped {
        outcome: Outcome::Cancelled,
        reason: Some(format!("{why} {where_}")),
    }))
}
