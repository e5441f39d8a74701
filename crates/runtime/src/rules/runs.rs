//! The rules of a run's row: how a new run starts, what a cancel does, which endings a
//! segment may write, and what a guarded write that matched nothing means.

use runwarden_base::StoreError;

use crate::events::{EventBody, cancelled_from};
use crate::queue::RequeueAnswer;
use crate::state::RunState;
use crate::store::{CancelAnswer, EventAppend, NewRunStatus, Run, RunCreate, SettleAnswer};

/// The termination reason an operator's cancel writes; people read it in `status` and
/// the API.
pub const CANCEL_REASON: &str = "cancelled by an operator";

/// The claim epoch of a run nobody has claimed yet (a queued run at birth).
pub const UNCLAIMED_EPOCH: i64 = 0;

/// The claim epoch of a synchronous run, claimed by its segment at birth. Every later
/// claim raises the epoch by one.
pub const FIRST_CLAIM_EPOCH: i64 = 1;

/// The row of a new run as it is inserted: a synchronous run is claimed by its segment
/// at birth and holds the first claim epoch; a queued run has no owner until a worker's
/// guarded claim.
pub fn new_run(params: RunCreate) -> Run {
    let (status, claimed_by, lease_expires_ms, claim_epoch) = match params.status {
        NewRunStatus::Running {
            owner,
            lease_until_ms,
        } => (
            RunState::Running,
            Some(owner),
            Some(lease_until_ms),
            FIRST_CLAIM_EPOCH,
        ),
        NewRunStatus::Queued => (RunState::Queued, None, None, UNCLAIMED_EPOCH),
    };
    Run {
        id: params.id,
        agent: params.agent,
        status,
        termination_reason: None,
        request: params.request,
        claimed_by,
        claim_epoch,
        lease_expires_ms,
        pending_effect: None,
        requeue_count: 0,
        rounds: 0,
        correlation: params.correlation,
        created_ms: params.now_ms,
        updated_ms: params.now_ms,
        origin: params.origin,
    }
}

/// The error of an insert that found a run with the same id already stored.
pub fn duplicate_run(id: &str) -> StoreError {
    StoreError::new(
        "creating a run",
        format!("a run with id {id} already exists: give every run a fresh UUIDv7"),
    )
}

/// What a cancel does to a run, decided from its status as read under the cancel's lock.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelStep {
    /// Nothing to write: answer this (no run, or a run already terminal).
    Answer(CancelAnswer),
    /// Move the run to `cancelled`: drop its stored request and its pending decisions,
    /// keep `pending_effect` and `claimed_by` (so the reaper and people can see a run
    /// cancelled mid-write), write [`CANCEL_REASON`], and append `final_event` when there
    /// is one (no segment holds a queued or parked run to write its own stop). Then
    /// answer [`CancelAnswer::Cancelled`] with `previous`.
    Cancel {
        /// The status the cancel leaves.
        previous: RunState,
        /// The run's final event, written by the store with the cancel.
        final_event: Option<EventBody>,
    },
}

/// The cancel's decision for a run whose status is `status` (`None`: no such run). A
/// terminal run is never left: completed, failed and cancelled runs answer
/// [`CancelAnswer::AlreadyTerminal`].
pub fn cancel_step(status: Option<RunState>) -> CancelStep {
    match status {
        None => CancelStep::Answer(CancelAnswer::NotFound),
        Some(previous) if previous.is_terminal() => {
            CancelStep::Answer(CancelAnswer::AlreadyTerminal(previous))
        }
        Some(previous) => CancelStep::Cancel {
            previous,
            final_event: cancelled_from(previous, CANCEL_REASON),
        },
    }
}

/// The error of a cancel whose guarded update matched nothing although the row, read
/// under the same lock, was not terminal.
pub fn cancel_raced(id: &str) -> StoreError {
    StoreError::new(
        "cancelling a run",
        format!("run {id} changed inside the cancel's transaction: retry the cancel"),
    )
}

/// A segment settles its run as completed or failed only; a cancel goes through
/// `run_cancel`.
pub fn check_settle_status(status: RunState) -> Result<(), StoreError> {
    check_ending(status, "settling a run", "a run settles as")
}

/// A final event appended with the run's end ends it as completed or failed only.
pub fn check_final_event_status(status: RunState) -> Result<(), StoreError> {
    check_ending(
        status,
        "appending a run event",
        "a final event ends a run as",
    )
}

/// What an append may carry: a final event's end as [`check_final_event_status`] says, and
/// an event before it that is no final one (nothing follows a run's final event).
pub fn check_event_append(append: &EventAppend) -> Result<(), StoreError> {
    if let Some(end) = &append.end {
        check_final_event_status(end.status)?;
    }
    match &append.before {
        Some(before) if crate::events::is_final_kind(&before.kind) => Err(StoreError::new(
            "appending a run event",
            format!(
                "{} is a final event and must be the last one; append it as the event itself",
                before.kind
            ),
        )),
        _ => Ok(()),
    }
}

fn check_ending(status: RunState, operation: &str, what: &str) -> Result<(), StoreError> {
    if matches!(status, RunState::Completed | RunState::Failed) {
        return Ok(());
    }
    Err(StoreError::new(
        operation,
        format!(
            "{what} completed or failed, not {}: cancel it with run_cancel",
            status.as_str()
        ),
    ))
}

/// Why a segment's guarded write (a settle, a requeue, a dead letter) matched nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostRow {
    /// A cancel won the row: the segment must not overwrite it, and no retry path takes
    /// a cancelled run.
    Cancelled,
    /// Another segment holds the run, or it is no longer running.
    LeaseLost,
}

/// Why a segment's guarded write matched nothing, from the run's status read after it
/// (`None`: no such run).
pub fn lost_row(status: Option<RunState>) -> LostRow {
    if status == Some(RunState::Cancelled) {
        LostRow::Cancelled
    } else {
        LostRow::LeaseLost
    }
}

impl From<LostRow> for SettleAnswer {
    fn from(lost: LostRow) -> Self {
        match lost {
            LostRow::Cancelled => Self::AlreadyCancelled,
            LostRow::LeaseLost => Self::LeaseLost,
        }
    }
}

impl From<LostRow> for RequeueAnswer {
    fn from(lost: LostRow) -> Self {
        match lost {
            LostRow::Cancelled => Self::AlreadyCancelled,
            LostRow::LeaseLost => Self::LeaseLost,
        }
    }
}

/// What a keyed create answers when the key is already stored (and not yet forgotten):
/// the same body hash is the same request, answered with the run it made; another body
/// under the same key is a client's mistake.
pub fn key_reused(stored_hash: &str, asked_hash: &str) -> bool {
    stored_hash != asked_hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(status: NewRunStatus) -> RunCreate {
        RunCreate {
            id: "r1".into(),
            agent: "a".into(),
            correlation: "r1".into(),
            request: None,
            status,
            now_ms: 7,
            origin: Default::default(),
        }
    }

    #[test]
    fn a_synchronous_run_is_born_claimed_under_the_first_epoch() {
        let run = new_run(create(NewRunStatus::Running {
            owner: "seg".into(),
            lease_until_ms: 99,
        }));
        assert_eq!(run.status, RunState::Running);
        assert_eq!(run.claimed_by.as_deref(), Some("seg"));
        assert_eq!(run.lease_expires_ms, Some(99));
        assert_eq!(run.claim_epoch, FIRST_CLAIM_EPOCH);
        assert_eq!((run.created_ms, run.updated_ms), (7, 7));
    }

    #[test]
    fn a_queued_run_is_born_unclaimed() {
        let run = new_run(create(NewRunStatus::Queued));
        assert_eq!(run.status, RunState::Queued);
        assert_eq!(run.claimed_by, None);
        assert_eq!(run.lease_expires_ms, None);
        assert_eq!(run.claim_epoch, UNCLAIMED_EPOCH);
    }

    #[test]
    fn a_cancel_of_no_run_or_a_terminal_run_writes_nothing() {
        assert_eq!(
            cancel_step(None),
            CancelStep::Answer(CancelAnswer::NotFound)
        );
        for terminal in [RunState::Completed, RunState::Failed, RunState::Cancelled] {
            assert_eq!(
                cancel_step(Some(terminal)),
                CancelStep::Answer(CancelAnswer::AlreadyTerminal(terminal))
            );
        }
    }

    #[test]
    fn a_cancel_writes_the_final_event_only_where_no_segment_holds_the_run() {
        for (previous, store_writes_final) in [
            (RunState::Queued, true),
            (RunState::WaitingForApproval, true),
            (RunState::Running, false),
        ] {
            let CancelStep::Cancel {
                previous: left,
                final_event,
            } = cancel_step(Some(previous))
            else {
                panic!("{previous:?} is not cancelled");
            };
            assert_eq!(left, previous);
            assert_eq!(final_event.is_some(), store_writes_final, "{previous:?}");
        }
    }

    #[test]
    fn a_segment_ends_its_run_as_completed_or_failed_only() {
        assert!(check_settle_status(RunState::Completed).is_ok());
        assert!(check_final_event_status(RunState::Failed).is_ok());
        for other in [
            RunState::Queued,
            RunState::Running,
            RunState::WaitingForApproval,
            RunState::Cancelled,
        ] {
            let error = check_settle_status(other).unwrap_err().to_string();
            assert!(error.contains("run_cancel"), "{error}");
            assert!(error.contains(other.as_str()), "{error}");
            assert!(check_final_event_status(other).is_err());
        }
    }

    #[test]
    fn an_event_stored_before_another_is_never_a_final_one() {
        let append = |before: &str| EventAppend {
            id: "r".into(),
            owner: "w".into(),
            epoch: 1,
            kind: "run_completed".into(),
            payload: serde_json::json!({"reason": "done"}),
            clear_fence: false,
            round: None,
            end: Some(crate::store::RunEnd {
                status: RunState::Completed,
                reason: "done".into(),
            }),
            now_ms: 1,
            before: Some(crate::store::EarlierEvent {
                kind: before.into(),
                payload: serde_json::json!({}),
            }),
        };
        assert!(check_event_append(&append("model_response")).is_ok());
        let error = check_event_append(&append("run_failed"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("run_failed is a final event"), "{error}");
    }

    #[test]
    fn a_lost_guard_on_a_cancelled_run_means_the_cancel_won() {
        assert_eq!(lost_row(Some(RunState::Cancelled)), LostRow::Cancelled);
        assert_eq!(
            SettleAnswer::from(lost_row(Some(RunState::Cancelled))),
            SettleAnswer::AlreadyCancelled
        );
        for other in [
            None,
            Some(RunState::Running),
            Some(RunState::Queued),
            Some(RunState::Completed),
        ] {
            assert_eq!(
                RequeueAnswer::from(lost_row(other)),
                RequeueAnswer::LeaseLost
            );
        }
    }

    #[test]
    fn a_known_key_with_another_body_is_reused() {
        assert!(!key_reused("h1", "h1"));
        assert!(key_reused("h1", "h2"));
    }
}
