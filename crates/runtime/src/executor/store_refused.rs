//! A tool call refused, unsent, because this side's store failed (the audit row that
//! announces it could not be written, or the vault could not read its records). That is
//! not the tool's answer: the model is never told, and the run does not go on as if the
//! tool had failed. The step is retried later.

use serde_json::Value;

use super::record::Recorded;
use super::{Executor, Segment};
use crate::events::{EventBody, ToolLog};
use crate::retry::RequeueCause;
use crate::state::{Outcome, RunState};

impl Executor {
    /// Ends the segment after a call the store refused: a note in the log clears the
    /// write fence the gate stamped (nothing was sent, so no retry may be refused for
    /// it), then the run goes back to the queue without spending its retry budget (the
    /// environment failed, not the run). A run executed outside the queue fails, saying
    /// why. When even the note cannot be stored the fence stays, and the retry decides
    /// on it as on any write whose fate the log does not show.
    pub(super) async fn store_refused(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call_id: &str,
        tool: &str,
        problem: String,
    ) -> Outcome {
        tracing::warn!(run = %segment.run.id, %tool, %problem, "a tool call was not made because the store failed; the step will be retried");
        let note = EventBody::ToolLog(ToolLog {
            round,
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            level: "warning".into(),
            logger: Some("runwarden".into()),
            data: Value::String(format!("not sent; the step will be retried: {problem}")),
        });
        match self.record(segment, note, true, None).await {
            Recorded::Stored => {}
            Recorded::LostRun => return Outcome::LeaseLost,
            Recorded::Failed(error) => {
                tracing::warn!(run = %segment.run.id, %error, "could not note the unsent call; its write fence stays");
            }
        }
        let reason = format!("a tool call was not made because the store failed: {problem}");
        if segment.options.retry.is_some() {
            self.requeue(segment, reason, RequeueCause::Unavailable)
                .await
        } else {
            self.settle(segment, RunState::Failed, reason).await
        }
    }
}
