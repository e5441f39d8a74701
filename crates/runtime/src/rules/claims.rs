//! The rules of claims and retries as a store applies them: what a requeue or a dead
//! letter answers once its guard matched, the status it leaves, and the final event the
//! reaper writes with a dead letter.
//!
//! Every claim raises the run's epoch by one (the fencing token every guarded write of a
//! segment checks); a run is born with [`UNCLAIMED_EPOCH`](super::runs::UNCLAIMED_EPOCH)
//! or, claimed at birth, [`FIRST_CLAIM_EPOCH`](super::runs::FIRST_CLAIM_EPOCH). Only a
//! queued run that is due may be claimed.

use crate::events::{EventBody, RunEnded};
use crate::queue::RequeueAnswer;
use crate::retry::RetryDecision;
use crate::state::RunState;

/// The answer of a segment's requeue or dead letter whose guard matched: a requeue that
/// `counts` against the budget raises the requeue count by one.
pub fn applied(decision: RetryDecision, requeue_count: u32, counts: bool) -> RequeueAnswer {
    match decision {
        RetryDecision::Requeue { .. } => RequeueAnswer::Requeued {
            requeue_count: requeue_count.saturating_add(u32::from(counts)),
        },
        RetryDecision::DeadLetter(code) => RequeueAnswer::DeadLettered(code),
    }
}

/// The status a retry decision leaves the run in: back in the queue, or failed for good
/// (the pending effect kept, so the record shows the write that was in flight).
pub fn status_after(decision: RetryDecision) -> RunState {
    match decision {
        RetryDecision::Requeue { .. } => RunState::Queued,
        RetryDecision::DeadLetter(_) => RunState::Failed,
    }
}

/// The final event the reaper writes with its decision, in the same transaction: a dead
/// letter is the run's end and the segment that held it is gone; a requeue is no end.
pub fn rescue_final_event(decision: RetryDecision, reason: &str) -> Option<EventBody> {
    match decision {
        RetryDecision::DeadLetter(_) => Some(EventBody::RunFailed(RunEnded {
            reason: reason.to_string(),
        })),
        RetryDecision::Requeue { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::DeadLetter;

    const REQUEUE: RetryDecision = RetryDecision::Requeue { retry_at_ms: 5 };
    const DEAD: RetryDecision = RetryDecision::DeadLetter(DeadLetter::FencedWrite);

    #[test]
    fn only_a_requeue_that_counts_spends_the_budget() {
        assert_eq!(
            applied(REQUEUE, 2, true),
            RequeueAnswer::Requeued { requeue_count: 3 }
        );
        assert_eq!(
            applied(REQUEUE, 2, false),
            RequeueAnswer::Requeued { requeue_count: 2 }
        );
        assert_eq!(
            applied(REQUEUE, u32::MAX, true),
            RequeueAnswer::Requeued {
                requeue_count: u32::MAX
            }
        );
        assert_eq!(
            applied(DEAD, 2, true),
            RequeueAnswer::DeadLettered(DeadLetter::FencedWrite)
        );
    }

    #[test]
    fn a_requeue_queues_and_a_dead_letter_fails() {
        assert_eq!(status_after(REQUEUE), RunState::Queued);
        assert_eq!(status_after(DEAD), RunState::Failed);
    }

    #[test]
    fn only_the_reapers_dead_letter_writes_a_final_event() {
        assert_eq!(rescue_final_event(REQUEUE, "stale"), None);
        let Some(EventBody::RunFailed(ended)) = rescue_final_event(DEAD, "stale") else {
            panic!("no run_failed");
        };
        assert_eq!(ended.reason, "stale");
    }
}
