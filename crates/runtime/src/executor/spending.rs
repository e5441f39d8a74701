//! What a run spends of its budgets: output tokens, tool calls and wall-clock time. A
//! budget that runs out trips the segment's budget stop, which ends the run as a failure
//! at the next boundary and stops a call in flight like a cancel.

use std::time::Duration;

use super::{Executor, Segment, TaskGuard};
use crate::time::now_ms;

impl Executor {
    /// R13: the wall-clock budget, measured from the run's creation: a timer that trips
    /// the budget stop and wakes the run's calls at once, as a cancel would.
    pub(super) fn wall_timer(&self, segment: &Segment<'_>) -> Option<TaskGuard> {
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
        Some(TaskGuard(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
            budget.trip(what);
            hub.wake(&id);
        })))
    }

    /// R13: counts a model step's output tokens; going over the total trips the budget.
    pub(super) fn spend_tokens(&self, segment: &Segment<'_>, output_tokens: u64) {
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
    pub(super) fn tokens_left(&self, segment: &Segment<'_>) {
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
    pub(super) fn tokens_cap(&self, segment: &Segment<'_>) -> Option<u32> {
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
    pub(super) fn take_tool_call(&self, segment: &Segment<'_>) -> bool {
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
}
