//! The model step: one round's call to the model, streamed with progress and capped by
//! the run's token budget, then its turn recorded before anything it asked for is done.

use std::time::Instant;

use runwarden_models::{FinishReason, Message, ModelError, ModelRequest, ModelTurn, Progress};
use tracing::Instrument as _;

use super::record::Recorded;
use super::{Executor, Segment};
use crate::events::{
    EventBody, ModelCancelled, ModelFailed, ModelProgress, ModelResponse, RunEnded,
};
use crate::progress::ProgressEvents;
use crate::signal::RunSignal;
use crate::state::{MODEL_NO_ANSWER, MODEL_TRUNCATED, Outcome, RunState};
use crate::store::RunEnd;

impl Executor {
    /// One model round as a step, its call carrying `signal` (taken at the boundary
    /// before it). `Ok` is a turn whose tool calls are to be made, recorded, with the
    /// signal, which the round
    /// keeps: while it lives the run stays registered with the watcher and the hub keeps
    /// when a cancel woke the call (the cancel's latency is measured from it). `Err` is
    /// the segment's outcome when it ends: a final answer, the call was cancelled or
    /// failed, the turn was cut or empty, or the run was lost.
    pub(super) async fn model_step(
        &self,
        segment: &Segment<'_>,
        round: u32,
        messages: &[Message],
        signal: RunSignal,
    ) -> Result<(ModelTurn, RunSignal), Outcome> {
        // P2: the policies decide the model call before anything leaves.
        self.model_gate(segment, round).await?;
        // R14: the call's limits, before its first byte.
        let hold = self.model_limits(segment, round).await?;
        let (completed, returned) = self.call_model(segment, round, messages, &signal).await;
        hold.release().await;
        match completed {
            Ok(turn) => Ok((self.record_turn(segment, round, turn).await?, signal)),
            Err(error) => Err(self.model_error(segment, round, &error, returned).await),
        }
    }

    /// Calls the model with the conversation so far, carrying `signal`; with when the
    /// call came back.
    async fn call_model(
        &self,
        segment: &Segment<'_>,
        round: u32,
        messages: &[Message],
        signal: &RunSignal,
    ) -> (Result<ModelTurn, ModelError>, Instant) {
        let agent = segment.agent;
        let (progress, progress_events) = self.stream_progress(segment, round);
        let request = ModelRequest {
            system: agent.system.clone(),
            messages: messages.to_vec(),
            tools: agent.tools.iter().map(|t| t.spec.clone()).collect(),
            correlation: Some(segment.run.correlation.clone()),
            progress: Some(progress),
            max_tokens: self.tokens_cap(segment),
        };
        let completed = agent
            .provider
            .complete(&request, Some(signal))
            .instrument(tracing::info_span!("model_call", round))
            .await;
        let returned = Instant::now();
        // No progress event may follow the step that ends the call.
        progress_events.finish().await;
        (completed, returned)
    }

    /// A model call that came back without a turn: its step, then the segment's end.
    async fn model_error(
        &self,
        segment: &Segment<'_>,
        round: u32,
        error: &ModelError,
        returned: Instant,
    ) -> Outcome {
        if error.is_cancelled() {
            // The step goes first: a budget stop settles the run, and nothing may follow
            // the terminal step in the log.
            let body = EventBody::ModelCancelled(ModelCancelled {
                round,
                error: error.to_string(),
            });
            let _ = self.record_soft(segment, body, Some(round)).await;
            let stop = self.must_stop(segment).await.unwrap_or(Outcome::Cancelled);
            self.observe_cancel(segment, returned, stop);
            return stop;
        }
        let body = EventBody::ModelFailed(ModelFailed {
            round,
            error: error.to_string(),
            retryable: error.is_retryable(),
            delivery: error.delivery(),
        });
        if self.record_soft(segment, body, Some(round)).await.is_none() {
            return Outcome::LeaseLost;
        }
        let reason = format!("the model call failed: {error}");
        self.fail(segment, reason, error.is_retryable()).await
    }

    /// Records the model's turn and counts its tokens. A turn that asked for tool calls
    /// must be durable before they run; a cut or empty turn ends the run.
    async fn record_turn(
        &self,
        segment: &Segment<'_>,
        round: u32,
        turn: ModelTurn,
    ) -> Result<ModelTurn, Outcome> {
        let step = ModelResponse {
            round,
            text: turn.text.clone(),
            tool_calls: turn.tool_calls.clone(),
            finish: turn.finish.clone(),
            usage: turn.usage,
        };
        let unusable = unusable_turn(&step, segment.agent.max_tokens);
        if step.tool_calls.is_empty() && unusable.is_none() {
            self.spend_tokens(segment, turn.usage.map_or(0, |u| u.output_tokens));
            let text = turn.text.unwrap_or_default();
            return Err(self.final_answer(segment, round, step, text).await);
        }
        let body = EventBody::ModelResponse(step);
        match self.record(segment, body, false, Some(round)).await {
            Recorded::Stored => {}
            Recorded::LostRun => return Err(Outcome::LeaseLost),
            Recorded::Failed(error) if unusable.is_none() => {
                // R8 (amended): a tool call runs only if the step that asked for it is
                // durable, or a resumed run would replay the turn and call it again.
                let reason = format!(
                    "the model's step could not be recorded, so the tool calls it asked for were not made: {error}"
                );
                return Err(self.fail(segment, reason, true).await);
            }
            Recorded::Failed(error) => {
                // A cut or empty turn: the run fails with its reason all the same.
                tracing::warn!(run = %segment.run.id, %error, "could not record the model's step; failing the run");
            }
        }
        self.spend_tokens(segment, turn.usage.map_or(0, |u| u.output_tokens));
        if let Some(reason) = unusable {
            // L4: a cut turn is never a final answer and its tool calls never run; the
            // same request would be cut again, so it is not retried. R13: when the cut
            // came from the run's token budget, the budget is the reason.
            let reason = truncated_by_budget(segment, &turn).unwrap_or(reason);
            return Err(self.settle(segment, RunState::Failed, reason).await);
        }
        Ok(turn)
    }

    /// The model's final answer. When nothing stops the run here, its step and the run's
    /// end are one write (R5: that write's guard is the read after the step). Otherwise,
    /// or when the store refused or failed that write, the step alone, the boundary, then
    /// the settle, as for any step.
    async fn final_answer(
        &self,
        segment: &Segment<'_>,
        round: u32,
        step: ModelResponse,
        text: String,
    ) -> Outcome {
        let body = EventBody::ModelResponse(step);
        if self.may_end_here(segment) {
            let ended = EventBody::RunCompleted(RunEnded {
                reason: text.clone(),
            });
            let end = RunEnd {
                status: RunState::Completed,
                reason: text.clone(),
            };
            let before = Some(body.clone());
            match self
                .record_after(segment, before, ended, false, Some(round), Some(end))
                .await
            {
                Recorded::Stored => return Outcome::Completed,
                // A cancel or a newer claim won the row: the step alone says which.
                Recorded::LostRun => {}
                Recorded::Failed(error) => {
                    tracing::warn!(run = %segment.run.id, %error, "could not record the final answer with the run's end; recording them one at a time");
                }
            }
        }
        match self.record(segment, body, false, Some(round)).await {
            Recorded::Stored => {}
            Recorded::LostRun => return Outcome::LeaseLost,
            Recorded::Failed(error) => {
                // A final answer with no call behind it: the settle stores its text.
                tracing::warn!(run = %segment.run.id, %error, "could not record the model's final step; settling with its text");
            }
        }
        if let Some(stop) = self.boundary(segment).await {
            return stop; // R5: the step is stored; stop without settling
        }
        self.settle(segment, RunState::Completed, text).await
    }

    /// While a model call streams, what it has produced so far (L6): counted against the
    /// run's token total (R13: going over trips the budget and wakes the call, which the
    /// vault then tears down like a cancelled one), and reported as throttled
    /// `model_progress` events. Call [`ProgressEvents::finish`] before recording the step.
    fn stream_progress(&self, segment: &Segment<'_>, round: u32) -> (Progress, ProgressEvents) {
        let target = self.progress_target(segment);
        let events = ProgressEvents::start(target, self.config.progress_interval);
        let reporter = events.reporter();
        let max = segment.budgets.max_output_tokens_total;
        let before = segment
            .spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .output_tokens;
        let (budget, hub, id) = (
            segment.budget.clone(),
            self.hub.clone(),
            segment.run.id.clone(),
        );
        let progress = Progress::new(move |so_far| {
            reporter.send_replace(Some(EventBody::ModelProgress(ModelProgress {
                round,
                tokens: so_far,
            })));
            let total = before.saturating_add(so_far);
            if let Some(max) = max
                && total > max
                && !budget.is_tripped()
            {
                budget.trip(format!(
                    "max_output_tokens_total = {max} (the run used {total})"
                ));
                hub.wake(&id);
            }
        });
        (progress, events)
    }
}

/// R13: the budget's reason when a truncated turn went past the run's token total (the
/// call was capped by [`Executor::tokens_cap`]); `None` for a cut by the agent's limit.
fn truncated_by_budget(segment: &Segment<'_>, turn: &ModelTurn) -> Option<String> {
    (turn.finish == Some(FinishReason::Length))
        .then(|| segment.budget.reason())
        .flatten()
}

/// L4: why a recorded model turn cannot be acted upon, as the run's termination reason:
/// a turn cut by the output limit (never a final answer, its tool calls never run), or a
/// turn with neither text nor tool calls that the model ended for a reason other than a
/// natural stop (`content_filter`, `refusal`, an unknown one), which is no answer either.
pub(super) fn unusable_turn(step: &ModelResponse, max_tokens: Option<u32>) -> Option<String> {
    let finish = step.finish.as_ref()?;
    if step.is_truncated() {
        let limit =
            max_tokens.map_or_else(|| "the provider's default".to_string(), |n| n.to_string());
        return Some(format!(
            "{MODEL_TRUNCATED}: the model hit its output limit (max_tokens = {limit}); raise max_tokens for the agent or ask for a shorter answer"
        ));
    }
    let empty = step.tool_calls.is_empty() && step.text.as_deref().is_none_or(str::is_empty);
    let natural = matches!(finish, FinishReason::Stop | FinishReason::ToolCalls);
    (empty && !natural).then(|| {
        format!(
            "{MODEL_NO_ANSWER}: the model ended its turn with finish reason {:?} and gave no answer",
            finish.as_str()
        )
    })
}
