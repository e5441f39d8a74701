//! Typed durable events (R1, R2): one variant per kind the executor writes, each with a
//! versioned payload struct. The store keeps `kind` and `payload` as text and JSON; this
//! module is the one place that turns them into types and back, for the executor (writes),
//! resumption (reads), the CLI and the API (render).
//!
//! Version 1 is the shape written before the types existed, so every stored row decodes.
//! A version-1 payload carries no version field; a later version writes `"v": N`, and a
//! binary that does not know `N` refuses the event instead of misreading it.

use runwarden_models::Usage;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::store::RunEvent;

mod decisions;
mod lifecycle;
mod model_steps;
mod reports;
mod tool_steps;

pub use decisions::{DecisionAnswered, DecisionAsked};
pub use lifecycle::{
    ORPHAN_GRACE_MS, RunEnded, RunRequeued, RunResumed, RunStarted, RunStopped, cancelled_from,
    stopped_orphan, stored_prompt,
};
pub use model_steps::{ModelCancelled, ModelFailed, ModelResponse};
pub use reports::{LimitWait, LimitWaited, ModelProgress, ToolLog, ToolProgress};
pub use tool_steps::{EffectUncertain, Leg, PolicyNote, StepOutcome, ToolExecuted};

/// The payload version this binary writes and reads.
pub const EVENT_VERSION: u32 = 1;

/// The payload field that names a version after the first.
const VERSION_FIELD: &str = "v";

/// One durable event of a run, typed. See the module docs for versions.
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// `run_started`.
    RunStarted(RunStarted),
    /// `run_resumed`.
    RunResumed(RunResumed),
    /// `model_response`.
    ModelResponse(ModelResponse),
    /// `model_cancelled`.
    ModelCancelled(ModelCancelled),
    /// `model_failed`.
    ModelFailed(ModelFailed),
    /// `tool_executed`.
    ToolExecuted(ToolExecuted),
    /// `effect_uncertain`.
    EffectUncertain(EffectUncertain),
    /// `run_requeued`.
    RunRequeued(RunRequeued),
    /// `run_completed`.
    RunCompleted(RunEnded),
    /// `run_failed`.
    RunFailed(RunEnded),
    /// `run_stopped`.
    RunStopped(RunStopped),
    /// `model_progress`.
    ModelProgress(ModelProgress),
    /// `tool_progress`.
    ToolProgress(ToolProgress),
    /// `tool_log`.
    ToolLog(ToolLog),
    /// `decision_asked`.
    DecisionAsked(DecisionAsked),
    /// `decision_answered`.
    DecisionAnswered(DecisionAnswered),
    /// `limit_wait`.
    LimitWait(LimitWait),
    /// `limit_waited`.
    LimitWaited(LimitWaited),
}

/// Every kind the executor writes, in the order a run usually writes them.
pub const EVENT_KINDS: [&str; 18] = [
    "run_started",
    "run_resumed",
    "model_response",
    "model_cancelled",
    "model_failed",
    "tool_executed",
    "effect_uncertain",
    "run_requeued",
    "run_completed",
    "run_failed",
    "run_stopped",
    "model_progress",
    "tool_progress",
    "tool_log",
    "decision_asked",
    "decision_answered",
    "limit_wait",
    "limit_waited",
];

/// The kinds that only report progress: resumption and usage skip them, and a reader may
/// drop them without losing the run's story.
pub const PROGRESS_KINDS: [&str; 5] = [
    "model_progress",
    "tool_progress",
    "tool_log",
    "limit_wait",
    "limit_waited",
];

/// The kinds after which a run writes nothing more: readers following a run stop there.
pub const FINAL_KINDS: [&str; 3] = ["run_completed", "run_failed", "run_stopped"];

/// True for a kind after which a run writes nothing more.
pub fn is_final_kind(kind: &str) -> bool {
    FINAL_KINDS.contains(&kind)
}

/// Why a stored event could not be read. Each names the run and the sequence, so the
/// operator can find the row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventDecodeError {
    /// The kind is none this binary writes (a newer binary or a hand edit wrote it).
    #[error(
        "event {seq} of run {run_id} has the unknown kind {kind:?}: it was written by a newer runwarden or edited by hand; upgrade runwarden, or start a new run"
    )]
    UnknownKind {
        /// The run.
        run_id: String,
        /// The event's sequence.
        seq: i64,
        /// The stored kind.
        kind: String,
    },
    /// The payload names a version this binary does not read.
    #[error(
        "event {seq} ({kind}) of run {run_id} has payload version {version}, and this runwarden reads only version {EVENT_VERSION}: upgrade runwarden"
    )]
    UnsupportedVersion {
        /// The run.
        run_id: String,
        /// The event's sequence.
        seq: i64,
        /// The stored kind.
        kind: String,
        /// The stored version (as text: it may not even be a number).
        version: String,
    },
    /// The payload does not have the kind's shape.
    #[error(
        "event {seq} ({kind}) of run {run_id} has a malformed payload ({detail}); the log was damaged or edited by hand: start a new run"
    )]
    Malformed {
        /// The run.
        run_id: String,
        /// The event's sequence.
        seq: i64,
        /// The stored kind.
        kind: String,
        /// What is wrong, without the stored values (they may hold a prompt or a result).
        detail: String,
    },
}

impl EventBody {
    /// The stored kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RunStarted(_) => "run_started",
            Self::RunResumed(_) => "run_resumed",
            Self::ModelResponse(_) => "model_response",
            Self::ModelCancelled(_) => "model_cancelled",
            Self::ModelFailed(_) => "model_failed",
            Self::ToolExecuted(_) => "tool_executed",
            Self::EffectUncertain(_) => "effect_uncertain",
            Self::RunRequeued(_) => "run_requeued",
            Self::RunCompleted(_) => "run_completed",
            Self::RunFailed(_) => "run_failed",
            Self::RunStopped(_) => "run_stopped",
            Self::ModelProgress(_) => "model_progress",
            Self::ToolProgress(_) => "tool_progress",
            Self::ToolLog(_) => "tool_log",
            Self::DecisionAsked(_) => "decision_asked",
            Self::DecisionAnswered(_) => "decision_answered",
            Self::LimitWait(_) => "limit_wait",
            Self::LimitWaited(_) => "limit_waited",
        }
    }

    /// The model round the event belongs to, when it has one.
    pub fn round(&self) -> Option<u32> {
        match self {
            Self::ModelResponse(e) => Some(e.round),
            Self::ModelCancelled(e) => Some(e.round),
            Self::ModelFailed(e) => Some(e.round),
            Self::ToolExecuted(e) => Some(e.round),
            Self::EffectUncertain(e) => Some(e.round),
            Self::ModelProgress(e) => Some(e.round),
            Self::ToolProgress(e) => Some(e.round),
            Self::ToolLog(e) => Some(e.round),
            Self::DecisionAsked(e) => Some(e.round),
            Self::LimitWait(e) => Some(e.round),
            Self::LimitWaited(e) => Some(e.round),
            _ => None,
        }
    }

    /// The stored payload, at [`EVENT_VERSION`].
    pub fn to_payload(&self) -> Value {
        let value = match self {
            Self::RunStarted(e) => serde_json::to_value(e),
            Self::RunResumed(e) => serde_json::to_value(e),
            Self::ModelResponse(e) => serde_json::to_value(e),
            Self::ModelCancelled(e) => serde_json::to_value(e),
            Self::ModelFailed(e) => serde_json::to_value(e),
            Self::ToolExecuted(e) => serde_json::to_value(e),
            Self::EffectUncertain(e) => serde_json::to_value(e),
            Self::RunRequeued(e) => serde_json::to_value(e),
            Self::RunCompleted(e) | Self::RunFailed(e) => serde_json::to_value(e),
            Self::RunStopped(e) => serde_json::to_value(e),
            Self::ModelProgress(e) => serde_json::to_value(e),
            Self::ToolProgress(e) => serde_json::to_value(e),
            Self::ToolLog(e) => serde_json::to_value(e),
            Self::DecisionAsked(e) => serde_json::to_value(e),
            Self::DecisionAnswered(e) => serde_json::to_value(e),
            Self::LimitWait(e) => serde_json::to_value(e),
            Self::LimitWaited(e) => serde_json::to_value(e),
        };
        // Plain structs with string keys always serialize; an empty object is never
        // reached, but it beats a panic in server code.
        value.unwrap_or_else(|_| Value::Object(Default::default()))
    }

    /// Reads a stored event. An unknown kind, a version this binary does not read, or a
    /// payload without the kind's shape is an error naming the run and the sequence; no
    /// field is ever given a default it did not have when it was written.
    pub fn decode(
        run_id: &str,
        seq: i64,
        kind: &str,
        payload: &Value,
    ) -> Result<Self, EventDecodeError> {
        if !EVENT_KINDS.contains(&kind) {
            return Err(EventDecodeError::UnknownKind {
                run_id: run_id.to_string(),
                seq,
                kind: kind.to_string(),
            });
        }
        if let Some(version) = payload.get(VERSION_FIELD)
            && version.as_u64() != Some(u64::from(EVENT_VERSION))
        {
            return Err(EventDecodeError::UnsupportedVersion {
                run_id: run_id.to_string(),
                seq,
                kind: kind.to_string(),
                version: version.to_string(),
            });
        }
        let malformed = |error: serde_json::Error| EventDecodeError::Malformed {
            run_id: run_id.to_string(),
            seq,
            kind: kind.to_string(),
            detail: describe(&error),
        };
        fn read<T: DeserializeOwned>(payload: &Value) -> Result<T, serde_json::Error> {
            T::deserialize(payload)
        }
        Ok(match kind {
            "run_started" => Self::RunStarted(read(payload).map_err(malformed)?),
            "run_resumed" => Self::RunResumed(read(payload).map_err(malformed)?),
            "model_response" => Self::ModelResponse(read(payload).map_err(malformed)?),
            "model_cancelled" => Self::ModelCancelled(read(payload).map_err(malformed)?),
            "model_failed" => Self::ModelFailed(read(payload).map_err(malformed)?),
            "tool_executed" => Self::ToolExecuted(read(payload).map_err(malformed)?),
            "effect_uncertain" => Self::EffectUncertain(read(payload).map_err(malformed)?),
            "run_requeued" => Self::RunRequeued(read(payload).map_err(malformed)?),
            "run_completed" => Self::RunCompleted(read(payload).map_err(malformed)?),
            "run_failed" => Self::RunFailed(read(payload).map_err(malformed)?),
            "run_stopped" => Self::RunStopped(read(payload).map_err(malformed)?),
            "model_progress" => Self::ModelProgress(read(payload).map_err(malformed)?),
            "tool_progress" => Self::ToolProgress(read(payload).map_err(malformed)?),
            "tool_log" => Self::ToolLog(read(payload).map_err(malformed)?),
            "decision_asked" => Self::DecisionAsked(read(payload).map_err(malformed)?),
            "decision_answered" => Self::DecisionAnswered(read(payload).map_err(malformed)?),
            "limit_wait" => Self::LimitWait(read(payload).map_err(malformed)?),
            "limit_waited" => Self::LimitWaited(read(payload).map_err(malformed)?),
            // EVENT_KINDS was checked above; this arm keeps the match total.
            other => {
                return Err(EventDecodeError::UnknownKind {
                    run_id: run_id.to_string(),
                    seq,
                    kind: other.to_string(),
                });
            }
        })
    }

    /// True for the events after which a run writes nothing more.
    pub fn is_final(&self) -> bool {
        is_final_kind(self.kind())
    }
}

/// serde's message without the stored value it quotes (`invalid type: string "..."`):
/// a payload may hold a prompt or a tool's answer, which must not travel into a reason.
fn describe(error: &serde_json::Error) -> String {
    let message = error.to_string();
    match (message.find(':'), message.find(", expected ")) {
        (Some(colon), Some(expected)) if colon < expected => {
            format!("{}{}", &message[..colon], &message[expected..])
        }
        _ => message,
    }
}

/// L5: the tokens a run used, summed over the model steps of its log (computed at read
/// time, so every store backend answers the same). Steps that recorded no usage count
/// nothing; an unreadable step is skipped, never guessed.
pub fn usage_of(events: &[RunEvent]) -> Usage {
    events
        .iter()
        .filter(|e| e.kind == "model_response")
        .filter_map(|e| e.payload.get("usage"))
        .filter_map(|u| serde_json::from_value::<Usage>(u.clone()).ok())
        .fold(Usage::default(), |sum, u| Usage {
            input_tokens: sum.input_tokens.saturating_add(u.input_tokens),
            output_tokens: sum.output_tokens.saturating_add(u.output_tokens),
        })
}

#[cfg(test)]
mod tests;
