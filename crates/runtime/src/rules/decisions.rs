//! The rules of operator decisions: what asking one does to its run, when an answer is
//! refused, and what an answer does to its run.

use crate::decision::{
    Answer, AnswerRefusal, Decision, DecisionKind, DecisionStatus, EXPIRED_REASON,
};
use crate::events::{EventBody, cancelled_from};
use crate::state::RunState;

/// The termination reason a cancel by answer writes, as a plain cancel does.
pub const CANCEL_BY_ANSWER_REASON: &str = "cancelled by an operator (answering a decision)";

/// Whether asking `decision` clears the run's write fence as it parks it: an
/// `input_required` result (a reissue) was the server's answer and did none of the
/// tool's work. Other parks keep the fence; a decision that does not park changes
/// nothing on the run but its time.
pub fn ask_clears_fence(decision: &Decision) -> bool {
    decision.parks_the_run() && decision.reissue.is_some()
}

/// The status the run must be in for an answer to `decision` to be taken: parked
/// (`waiting_for_approval`) for the kinds that park, `running` for `input`.
pub fn run_waits_in(decision: &Decision) -> RunState {
    if decision.parks_the_run() {
        RunState::WaitingForApproval
    } else {
        RunState::Running
    }
}

/// Why `answer` to `decision` is refused at `now_ms`, given its run's status (`None`: no
/// run, or a status this build cannot read); `None` when the answer may be taken.
///
/// Only a pending decision takes an answer. A cancelled run refuses it (the cancel
/// wins). An operator's answer is refused at or after the expiry, and the runtime's
/// expiry ([`Answer::Expired`]) before it. Otherwise the run must still wait on the
/// decision (see [`run_waits_in`]).
pub fn answer_refusal(
    decision: &Decision,
    run: Option<RunState>,
    answer: Answer,
    now_ms: i64,
) -> Option<AnswerRefusal> {
    match decision.status {
        DecisionStatus::Answered => return Some(AnswerRefusal::AlreadyAnswered),
        DecisionStatus::Expired => return Some(AnswerRefusal::Expired),
        DecisionStatus::Dropped => return Some(AnswerRefusal::RunCancelled),
        DecisionStatus::Pending => {}
    }
    let expiry = answer == Answer::Expired;
    let due = decision.expires_ms <= now_ms;
    if run == Some(RunState::Cancelled) {
        Some(AnswerRefusal::RunCancelled)
    } else if expiry && !due {
        Some(AnswerRefusal::NotDue)
    } else if !expiry && due {
        Some(AnswerRefusal::Expired)
    } else if run != Some(run_waits_in(decision)) {
        Some(AnswerRefusal::RunNotWaiting)
    } else {
        None
    }
}

/// The decision's status and reason once `answer` is taken: the runtime's expiry
/// records [`EXPIRED_REASON`], an operator's answer the reason given with it.
pub fn recorded(answer: Answer, reason: Option<&str>) -> (DecisionStatus, Option<String>) {
    if answer == Answer::Expired {
        (DecisionStatus::Expired, Some(EXPIRED_REASON.to_string()))
    } else {
        (DecisionStatus::Answered, reason.map(str::to_string))
    }
}

/// What a taken answer does to its run, in the answer's transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum RunAfterAnswer {
    /// The run does not park on this kind (`input`): its segment reads the answer.
    Stays,
    /// A cancel by answer is the cancel: the parked run becomes `cancelled` with
    /// [`CANCEL_BY_ANSWER_REASON`], its stored request dropped, and its final event
    /// appended (no segment holds it).
    Cancelled {
        /// The run's final event.
        final_event: Option<EventBody>,
    },
    /// Back to the queue, due now (any worker on any node claims it), lease released.
    Requeued {
        /// Clear the write fence: a person said what an uncertain write did.
        clear_fence: bool,
    },
}

impl RunAfterAnswer {
    /// The run's new status, when it moves.
    pub fn status(&self) -> Option<RunState> {
        match self {
            Self::Stays => None,
            Self::Cancelled { .. } => Some(RunState::Cancelled),
            Self::Requeued { .. } => Some(RunState::Queued),
        }
    }
}

/// What `answer`, taken, does to the run of `decision`.
pub fn run_after_answer(decision: &Decision, answer: Answer) -> RunAfterAnswer {
    if !decision.parks_the_run() {
        RunAfterAnswer::Stays
    } else if answer == Answer::Cancel {
        RunAfterAnswer::Cancelled {
            final_event: cancelled_from(RunState::WaitingForApproval, CANCEL_BY_ANSWER_REASON),
        }
    } else {
        RunAfterAnswer::Requeued {
            clear_fence: decision.kind == DecisionKind::EffectUncertain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Reissue;
    use serde_json::json;

    fn decision(kind: DecisionKind, status: DecisionStatus) -> Decision {
        Decision {
            id: "d1".into(),
            run_id: "r1".into(),
            kind,
            round: 1,
            call_id: "c1".into(),
            tool: "t".into(),
            arguments: json!({}),
            arguments_hash: "h".into(),
            message: None,
            requested_schema: None,
            asked_ms: 0,
            expires_ms: 100,
            status,
            answer: None,
            reason: None,
            answer_arguments: None,
            content: None,
            actor: None,
            answered_ms: None,
            reissue: None,
            in_call: false,
        }
    }

    fn pending(kind: DecisionKind) -> Decision {
        decision(kind, DecisionStatus::Pending)
    }

    const PARKED: Option<RunState> = Some(RunState::WaitingForApproval);

    #[test]
    fn an_approval_asked_in_a_call_never_parks_the_run_and_its_answer_leaves_it_running() {
        let mut d = pending(DecisionKind::Approval);
        assert!(d.parks_the_run());
        d.in_call = true;
        assert!(!d.parks_the_run());
        assert_eq!(run_waits_in(&d), RunState::Running);
        assert_eq!(run_after_answer(&d, Answer::Approve), RunAfterAnswer::Stays);
        assert_eq!(run_after_answer(&d, Answer::Cancel), RunAfterAnswer::Stays);
        assert!(!ask_clears_fence(&d));
    }

    #[test]
    fn only_a_pending_decision_takes_an_answer() {
        for (status, why) in [
            (DecisionStatus::Answered, AnswerRefusal::AlreadyAnswered),
            (DecisionStatus::Expired, AnswerRefusal::Expired),
            (DecisionStatus::Dropped, AnswerRefusal::RunCancelled),
        ] {
            let d = decision(DecisionKind::Approval, status);
            assert_eq!(answer_refusal(&d, PARKED, Answer::Approve, 10), Some(why));
        }
        let d = pending(DecisionKind::Approval);
        assert_eq!(answer_refusal(&d, PARKED, Answer::Approve, 10), None);
    }

    #[test]
    fn a_cancelled_run_refuses_every_answer_even_a_late_one() {
        let d = pending(DecisionKind::Approval);
        let cancelled = Some(RunState::Cancelled);
        assert_eq!(
            answer_refusal(&d, cancelled, Answer::Approve, 10),
            Some(AnswerRefusal::RunCancelled)
        );
        assert_eq!(
            answer_refusal(&d, cancelled, Answer::Approve, 500),
            Some(AnswerRefusal::RunCancelled)
        );
    }

    #[test]
    fn an_answer_is_refused_from_the_expiry_on_and_an_expiry_before_it() {
        let d = pending(DecisionKind::Approval);
        assert_eq!(
            answer_refusal(&d, PARKED, Answer::Approve, 100),
            Some(AnswerRefusal::Expired)
        );
        assert_eq!(answer_refusal(&d, PARKED, Answer::Approve, 99), None);
        assert_eq!(
            answer_refusal(&d, PARKED, Answer::Expired, 99),
            Some(AnswerRefusal::NotDue)
        );
        assert_eq!(answer_refusal(&d, PARKED, Answer::Expired, 100), None);
    }

    #[test]
    fn the_run_must_still_wait_where_the_kind_leaves_it() {
        let approval = pending(DecisionKind::Approval);
        for run in [None, Some(RunState::Running), Some(RunState::Completed)] {
            assert_eq!(
                answer_refusal(&approval, run, Answer::Approve, 10),
                Some(AnswerRefusal::RunNotWaiting)
            );
        }
        let input = pending(DecisionKind::Input);
        assert_eq!(run_waits_in(&input), RunState::Running);
        assert_eq!(
            answer_refusal(&input, Some(RunState::Running), Answer::Accept, 10),
            None
        );
        assert_eq!(
            answer_refusal(&input, PARKED, Answer::Accept, 10),
            Some(AnswerRefusal::RunNotWaiting)
        );
    }

    #[test]
    fn an_expiry_records_its_own_reason_and_an_answer_the_one_given() {
        assert_eq!(
            recorded(Answer::Expired, Some("ignored")),
            (DecisionStatus::Expired, Some(EXPIRED_REASON.to_string()))
        );
        assert_eq!(
            recorded(Answer::Deny, Some("no")),
            (DecisionStatus::Answered, Some("no".to_string()))
        );
    }

    #[test]
    fn a_cancel_by_answer_cancels_the_parked_run_with_its_final_event() {
        let d = pending(DecisionKind::Approval);
        let after = run_after_answer(&d, Answer::Cancel);
        assert_eq!(after.status(), Some(RunState::Cancelled));
        let RunAfterAnswer::Cancelled { final_event } = after else {
            panic!("not cancelled");
        };
        assert!(final_event.is_some());
    }

    #[test]
    fn only_an_answer_to_an_uncertain_write_clears_the_fence() {
        let uncertain = pending(DecisionKind::EffectUncertain);
        assert_eq!(
            run_after_answer(&uncertain, Answer::Approve),
            RunAfterAnswer::Requeued { clear_fence: true }
        );
        let approval = pending(DecisionKind::Approval);
        assert_eq!(
            run_after_answer(&approval, Answer::Approve),
            RunAfterAnswer::Requeued { clear_fence: false }
        );
        let input = pending(DecisionKind::Input);
        assert_eq!(
            run_after_answer(&input, Answer::Accept),
            RunAfterAnswer::Stays
        );
    }

    #[test]
    fn only_a_reissued_park_clears_the_fence_when_asked() {
        assert!(!ask_clears_fence(&pending(DecisionKind::Approval)));
        let mut input = pending(DecisionKind::Input);
        assert!(
            !ask_clears_fence(&input),
            "an input during a call does not park"
        );
        input.reissue = Some(Reissue {
            input_key: "k".into(),
            request_state: None,
        });
        assert!(input.parks_the_run());
        assert!(ask_clears_fence(&input));
    }
}
