//! A run's status (R1) and the outcomes a segment returns (R10).

use serde::{Deserialize, Serialize};

/// Where a run is in its life. Terminal states are never left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Stored with its request, waiting for a worker. Into it: `enqueue`, or the reaper
    /// requeueing a stale run. Out of it: a worker's guarded claim, or a cancel.
    Queued,
    /// A segment holds the lease and executes. Into it: a synchronous run at birth, or a
    /// claim. Out of it: the segment settling (completed, failed), a cancel, or the reaper.
    Running,
    /// Suspended until an operator approves a step. Out of it: approval or a cancel.
    WaitingForApproval,
    /// Terminal: the model gave its final answer.
    Completed,
    /// Terminal: the run failed, or was dead-lettered (see the termination reason).
    Failed,
    /// Terminal: an operator cancelled it (R4). No resume, retry or reaper path takes it.
    Cancelled,
}

impl RunState {
    /// The stable text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingForApproval => "waiting_for_approval",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Every state, in the order a run may pass through them.
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::WaitingForApproval,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// Parses a stored status.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Completed, failed and cancelled are terminal (R1).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// The termination reason of a run that stopped because a write's effect is unknown
/// (R11): its call may have reached the server and no answer came back. The fence stays
/// and no path re-sends the call. (A later step turns this into an operator decision.)
pub const EFFECT_UNCERTAIN: &str = "EFFECT_UNCERTAIN";

/// The termination reason code of a run whose model turn was cut by its output limit
/// (L4): a truncated turn is never a final answer and its tool calls are never run. Not
/// retried: the same request would be cut again.
pub(crate) const MODEL_TRUNCATED: &str = "MODEL_TRUNCATED";

/// The termination reason code of a run whose model ended a turn with neither text nor
/// tool calls for a reason other than a natural stop (`content_filter`, `refusal`, or one
/// this binary does not know): an empty answer is not passed off as a completed run.
pub(crate) const MODEL_NO_ANSWER: &str = "MODEL_NO_ANSWER";

/// How a segment ended, as a value (R10). Never an error.
///
/// Its words are the run statuses' words (`completed`, `waiting_for_approval`, ...), so
/// `run`, `worker`, the API, the console and the events say one thing; `lease_lost` and
/// `dead_lettered` are the two endings with no status of their own. Events stored before
/// the words were lower case (`CANCELLED`) still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The run completed.
    #[serde(alias = "COMPLETED")]
    Completed,
    /// The run failed; the row says why.
    #[serde(alias = "FAILED")]
    Failed,
    /// An operator cancelled the run; the segment stopped without settling.
    #[serde(alias = "CANCELLED")]
    Cancelled,
    /// The run waits for an approval.
    #[serde(alias = "AWAITING_APPROVAL")]
    WaitingForApproval,
    /// The run went back to the queue for another attempt.
    #[serde(rename = "queued", alias = "REQUEUED")]
    Requeued,
    /// The segment lost its lease and stopped at once, settling nothing (R3).
    #[serde(alias = "LEASE_LOST")]
    LeaseLost,
    /// The run was failed for good by the reaper or the retry budget.
    #[serde(alias = "DEAD_LETTERED")]
    DeadLettered,
}

impl Outcome {
    /// The word used in output and on the wire: the status it leaves the run in, or
    /// `lease_lost` / `dead_lettered`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => RunState::Completed.as_str(),
            Self::Failed => RunState::Failed.as_str(),
            Self::Cancelled => RunState::Cancelled.as_str(),
            Self::WaitingForApproval => RunState::WaitingForApproval.as_str(),
            Self::Requeued => RunState::Queued.as_str(),
            Self::LeaseLost => "lease_lost",
            Self::DeadLettered => "dead_lettered",
        }
    }
}
