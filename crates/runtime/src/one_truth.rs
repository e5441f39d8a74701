//! One truth per run: the row's status and the log's final event tell the same story.
//! The test suites check it after every scenario, whoever ended the run (a worker, a
//! cancel, a decision's answer, the reaper).

use crate::events::FINAL_KINDS;
use crate::state::RunState;

/// The final event kind a run in `status` ends its log with; `None` for a run that is not
/// over.
pub(crate) fn final_kind_of(status: RunState) -> Option<&'static str> {
    match status {
        RunState::Completed => Some("run_completed"),
        RunState::Failed => Some("run_failed"),
        RunState::Cancelled => Some("run_stopped"),
        RunState::Queued | RunState::Running | RunState::WaitingForApproval => None,
    }
}

/// Checks run `run_id`, whose row says `status` and whose log holds events of `kinds`
/// (oldest first), once nothing is writing it any more: a finished run's log holds
/// exactly one final event, its last, of the kind its status names; a run that is not
/// over holds none. The error says what disagrees.
pub fn check_row_matches_log(run_id: &str, status: RunState, kinds: &[&str]) -> Result<(), String> {
    let finals: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| FINAL_KINDS.contains(k))
        .collect();
    let expected = final_kind_of(status);
    let story = || {
        format!(
            "run {run_id}: the row says {} but the log holds {kinds:?}",
            status.as_str()
        )
    };
    match (expected, finals.as_slice()) {
        (None, []) => Ok(()),
        (Some(kind), [only]) if *only == kind && kinds.last() == Some(&kind) => Ok(()),
        _ => Err(story()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_run_ends_its_log_with_the_final_event_its_status_names() {
        let ok = ["run_started", "tool_executed", "run_completed"];
        assert!(check_row_matches_log("r", RunState::Completed, &ok).is_ok());
        assert!(check_row_matches_log("r", RunState::Cancelled, &ok).is_err());
        assert!(check_row_matches_log("r", RunState::Failed, &["run_started"]).is_err());
        let two = ["run_failed", "run_completed"];
        assert!(check_row_matches_log("r", RunState::Completed, &two).is_err());
        assert!(check_row_matches_log("r", RunState::Running, &["run_started"]).is_ok());
        assert!(check_row_matches_log("r", RunState::Queued, &["run_failed"]).is_err());
    }
}
