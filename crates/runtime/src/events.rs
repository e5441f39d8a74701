//! Typed durable events (R1, R2): one variant per kind the executor writes, each with a
//! versioned payload struct. The store keeps `kind` and `payload` as text and JSON; this
//! module is the one place that turns them into types and back, for the executor (writes),
//! resumption (reads), the CLI and the API (render).
//!
//! Version 1 is the shape written before the types existed, so every stored row decodes.
//! A version-1 payload carries no version field; a later version writes `"v": N`, and a
//! binary that does not know `N` refuses the event instead of misreading it.

use runwarden_mcp::Effect;
use runwarden_models::{FinishReason, ToolCallRequest, Usage};
use runwarden_vault::Delivery;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{Answer, Decision, DecisionKind};
use crate::state::Outcome;

/// The payload version this binary writes and reads.
pub const EVENT_VERSION: u32 = 1;

/// The payload field that names a version after the first.
const VERSION_FIELD: &str = "v";

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

/// `model_response`: the model's answer in one round (R2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The round, from 1.
    pub round: u32,
    /// The model's text, if any (stored as `null` when none).
    pub text: Option<String>,
    /// The tool calls it asked for; none means this is the final answer (unless the turn
    /// was truncated, L4).
    pub tool_calls: Vec<ToolCallRequest>,
    /// Why the model stopped (L4), when the server said; absent in version-1 payloads
    /// written before it was recorded, and then not written, so they stay byte-identical.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<FinishReason>,
    /// The tokens the call used (L5), when the server said; absent like `finish`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ModelResponse {
    /// L4: the output limit cut this turn, so it is neither a final answer nor a source of
    /// tool calls to run.
    pub fn is_truncated(&self) -> bool {
        self.finish == Some(FinishReason::Length)
    }
}

/// `model_cancelled`: the model call of a round was cancelled in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCancelled {
    /// The round.
    pub round: u32,
    /// What the call reported.
    pub error: String,
}

/// `model_failed`: the model call of a round failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFailed {
    /// The round.
    pub round: u32,
    /// What the call reported.
    pub error: String,
    /// Whether a retry may heal it (R9).
    pub retryable: bool,
    /// How far the call got (V8).
    pub delivery: Delivery,
}

/// How a tool step ended, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// The tool answered with a result.
    Succeeded,
    /// The tool answered with an error result.
    ToolError,
    /// The call failed.
    Failed,
    /// The call was cancelled.
    Cancelled,
    /// The runtime refused the call before anything was sent (no such tool, arguments
    /// that are not an object).
    Refused,
    /// An operator denied the call (or its approval expired); nothing was sent (R12).
    Denied,
}

impl StepOutcome {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::ToolError => "tool_error",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
            Self::Denied => "denied",
        }
    }
}

/// `tool_executed`: one tool call as a step (R2). A call the runtime refused carries only
/// the round, the call, the tool, the outcome and the text; the other fields are absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolExecuted {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The tool's name on its server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// The server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The tool's effect at bind time (M10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// How it ended.
    pub outcome: StepOutcome,
    /// How far the `tools/call` got (V8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Whether it may have reached the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<bool>,
    /// What the model reads.
    pub text: String,
}

impl ToolExecuted {
    /// A call the runtime refused before anything was sent.
    pub fn refused(round: u32, call: &ToolCallRequest, text: &str) -> Self {
        Self {
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            remote: None,
            server: None,
            effect: None,
            outcome: StepOutcome::Refused,
            delivery: None,
            sent: None,
            text: text.to_string(),
        }
    }
}

/// One HTTP leg of an uncertain write, with its audit intent row (V7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leg {
    /// The JSON-RPC method.
    pub method: String,
    /// True when the leg got an HTTP answer.
    pub answered: bool,
    /// The leg's intent row in the audit log, once committed.
    pub audit_id: Option<i64>,
    /// How long it took.
    pub millis: u64,
}

/// `effect_uncertain`: a write whose call may have reached the server and got no answer
/// (R11). Its fence stays; a non-idempotent one is never sent again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectUncertain {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The tool's name on its server.
    pub remote: String,
    /// The server.
    pub server: String,
    /// The write's effect.
    pub effect: Effect,
    /// How it ended.
    pub outcome: StepOutcome,
    /// How far the call got: `maybe_delivered`.
    pub delivery: Delivery,
    /// Whether it may have reached the server.
    pub sent: bool,
    /// What the model reads.
    pub text: String,
    /// The JSON-RPC id of the `tools/call`, once one was sent.
    pub request_id: Option<i64>,
    /// Every leg of the operation, in order.
    pub legs: Vec<Leg>,
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
pub fn cancelled_from(previous: crate::RunState, why: &str) -> Option<EventBody> {
    let where_ = match previous {
        crate::RunState::Queued => {
            "while queued: no worker will take it up, and a retry it was waiting for will not happen"
        }
        crate::RunState::WaitingForApproval => "while it waited for an operator decision",
        _ => return None,
    };
    Some(EventBody::RunStopped(RunStopped {
        outcome: Outcome::Cancelled,
        reason: Some(format!("{why} {where_}")),
    }))
}

/// `model_progress`: how far a streaming model call has got (L6), written at most a few
/// times a second while the stream runs. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelProgress {
    /// The round.
    pub round: u32,
    /// Output tokens generated so far in this call.
    pub tokens: u64,
}

/// `tool_progress`: a server's `notifications/progress` for a running tool call (M15),
/// throttled to at most a few a second. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolProgress {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The progress so far, as the server counts it.
    pub progress: f64,
    /// The total, when the server knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// The server's message, when it sent one (bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `tool_log`: a server's `notifications/message` during a tool call (M15), bounded in
/// size and number per call. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolLog {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The syslog level the server gave (`info`, `warning`, ...).
    pub level: String,
    /// The server's logger name, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<String>,
    /// The logged data, cut to a bounded size.
    pub data: Value,
}

/// `decision_asked`: the run asked an operator about one tool call (R12). For `approval`
/// and `effect_uncertain` the run is parked in the same transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionAsked {
    /// The decision's id.
    pub decision_id: String,
    /// What it is about.
    pub kind: DecisionKind,
    /// The model round whose tool call it concerns.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The canonical hash of the call's arguments (the decision is bound to them).
    pub arguments_hash: String,
    /// When it expires, Unix milliseconds UTC.
    pub expires_ms: i64,
    /// M19: the call ended with the server's `input_required`, so the run is parked and its
    /// answer is sent by re-issuing the call (absent for an elicitation during a call).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reissue: bool,
}

/// `decision_answered`: the decision's answer, appended by the answer's own transaction
/// (an operator's, or the runtime's expiry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionAnswered {
    /// The decision's id.
    pub decision_id: String,
    /// What it was about.
    pub kind: DecisionKind,
    /// The model's id for the call.
    pub call_id: String,
    /// The canonical hash of the arguments the model asked for.
    pub arguments_hash: String,
    /// The answer.
    pub answer: Answer,
    /// Who answered.
    pub actor: String,
    /// The reason given (a denial's, or "expired").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Approval: the arguments the operator edited, when they did (both are recorded: the
    /// model's are in its step, the operator's here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

impl DecisionAnswered {
    /// The event of an answered (or expired) decision.
    pub fn of(decision: &Decision) -> Option<Self> {
        Some(Self {
            decision_id: decision.id.clone(),
            kind: decision.kind,
            call_id: decision.call_id.clone(),
            arguments_hash: decision.arguments_hash.clone(),
            answer: decision.answer?,
            actor: decision.actor.clone().unwrap_or_default(),
            reason: decision.reason.clone(),
            arguments: decision.answer_arguments.clone(),
        })
    }
}

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
}

/// Every kind the executor writes, in the order a run usually writes them.
pub const EVENT_KINDS: [&str; 16] = [
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
];

/// The kinds that only report progress: resumption and usage skip them, and a reader may
/// drop them without losing the run's story.
pub const PROGRESS_KINDS: [&str; 3] = ["model_progress", "tool_progress", "tool_log"];

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
pub fn usage_of(events: &[crate::store::RunEvent]) -> Usage {
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
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_round_trips_through_its_payload() {
        let bodies = [
            EventBody::RunStarted(RunStarted {
                agent: "helper".into(),
                prompt: "go".into(),
                owner: "w-1".into(),
            }),
            EventBody::RunResumed(RunResumed {
                owner: "w-2".into(),
                from_round: 2,
                attempt: 3,
            }),
            EventBody::ModelResponse(ModelResponse {
                round: 1,
                text: None,
                tool_calls: vec![ToolCallRequest {
                    id: "c1".into(),
                    name: "srv__create".into(),
                    arguments: json!({"q": "printer"}),
                    invalid_arguments: None,
                }],
                finish: None,
                usage: None,
            }),
            EventBody::ModelResponse(ModelResponse {
                round: 2,
                text: Some("half an ans".into()),
                tool_calls: Vec::new(),
                finish: Some(FinishReason::Length),
                usage: Some(Usage {
                    input_tokens: 120,
                    output_tokens: 10,
                }),
            }),
            EventBody::ModelCancelled(ModelCancelled {
                round: 1,
                error: "cancelled".into(),
            }),
            EventBody::ModelFailed(ModelFailed {
                round: 2,
                error: "503".into(),
                retryable: true,
                delivery: Delivery::Answered,
            }),
            EventBody::ToolExecuted(ToolExecuted {
                round: 1,
                call_id: "c1".into(),
                tool: "srv__nope".into(),
                remote: None,
                server: None,
                effect: None,
                outcome: StepOutcome::Refused,
                delivery: None,
                sent: None,
                text: "no tool".into(),
            }),
            EventBody::EffectUncertain(EffectUncertain {
                round: 1,
                call_id: "c1".into(),
                tool: "srv__create".into(),
                remote: "create".into(),
                server: "srv".into(),
                effect: Effect::NonIdempotentWrite,
                outcome: StepOutcome::Failed,
                delivery: Delivery::MaybeDelivered,
                sent: true,
                text: "no answer".into(),
                request_id: None,
                legs: vec![Leg {
                    method: "tools/call".into(),
                    answered: false,
                    audit_id: Some(5),
                    millis: 2,
                }],
            }),
            EventBody::RunRequeued(RunRequeued {
                reason: "503".into(),
                counts: true,
                retry_in_ms: 1_500,
            }),
            EventBody::RunCompleted(RunEnded {
                reason: "done".into(),
            }),
            EventBody::RunFailed(RunEnded {
                reason: "no".into(),
            }),
            EventBody::RunStopped(RunStopped {
                outcome: Outcome::Cancelled,
                reason: None,
            }),
            EventBody::RunStopped(RunStopped {
                outcome: Outcome::Cancelled,
                reason: Some("cancelled by an operator while queued".into()),
            }),
            EventBody::ModelProgress(ModelProgress {
                round: 2,
                tokens: 40,
            }),
            EventBody::ToolProgress(ToolProgress {
                round: 2,
                call_id: "c2".into(),
                tool: "srv__slow".into(),
                progress: 3.0,
                total: Some(10.0),
                message: Some("copying".into()),
            }),
            EventBody::ToolLog(ToolLog {
                round: 2,
                call_id: "c2".into(),
                tool: "srv__slow".into(),
                level: "info".into(),
                logger: None,
                data: serde_json::json!("step 3"),
            }),
            EventBody::DecisionAsked(DecisionAsked {
                decision_id: "d1".into(),
                kind: DecisionKind::Approval,
                round: 1,
                call_id: "c1".into(),
                tool: "srv__create".into(),
                arguments_hash: "ab".repeat(32),
                expires_ms: 1_700_000_000_000,
                reissue: false,
            }),
            EventBody::DecisionAsked(DecisionAsked {
                decision_id: "d2".into(),
                kind: DecisionKind::Input,
                round: 1,
                call_id: "c1".into(),
                tool: "srv__create".into(),
                arguments_hash: "ab".repeat(32),
                expires_ms: 1_700_000_000_000,
                reissue: true,
            }),
            EventBody::DecisionAnswered(DecisionAnswered {
                decision_id: "d1".into(),
                kind: DecisionKind::Approval,
                call_id: "c1".into(),
                arguments_hash: "ab".repeat(32),
                answer: Answer::Approve,
                actor: "cli".into(),
                reason: None,
                arguments: Some(serde_json::json!({"title": "edited"})),
            }),
        ];
        let mut kinds: Vec<&str> = bodies.iter().map(EventBody::kind).collect();
        kinds.dedup();
        assert_eq!(kinds, EVENT_KINDS, "one variant per kind, none forgotten");
        for body in bodies {
            let payload = body.to_payload();
            assert_eq!(
                payload.get(VERSION_FIELD),
                None,
                "version 1 writes no field"
            );
            let back = EventBody::decode("r", 1, body.kind(), &payload).unwrap();
            assert_eq!(back, body);
        }
    }

    #[test]
    fn a_model_step_names_its_finish_reason_and_usage_only_when_known() {
        let step = ModelResponse {
            round: 1,
            text: Some("cut".into()),
            tool_calls: Vec::new(),
            finish: Some(FinishReason::Length),
            usage: Some(Usage {
                input_tokens: 7,
                output_tokens: 10,
            }),
        };
        let payload = EventBody::ModelResponse(step.clone()).to_payload();
        assert_eq!(payload["finish"], json!("length"));
        assert_eq!(
            payload["usage"],
            json!({"input_tokens": 7, "output_tokens": 10})
        );
        assert!(step.is_truncated());
        let filtered = EventBody::ModelResponse(ModelResponse {
            finish: Some(FinishReason::ContentFilter),
            ..step
        })
        .to_payload();
        assert_eq!(filtered["finish"], json!("content_filter"));
        let unknown = EventBody::decode(
            "r",
            1,
            "model_response",
            &json!({"round": 1, "text": null, "tool_calls": [], "finish": "pause_turn"}),
        )
        .unwrap();
        let EventBody::ModelResponse(unknown) = unknown else {
            panic!("a model step decodes as one");
        };
        assert_eq!(
            unknown.finish,
            Some(FinishReason::Other("pause_turn".into()))
        );
    }

    #[test]
    fn an_unknown_kind_is_an_error_naming_the_run_and_the_sequence() {
        let error = EventBody::decode("run-7", 4, "tool_exploded", &json!({})).unwrap_err();
        assert!(matches!(
            error,
            EventDecodeError::UnknownKind { seq: 4, .. }
        ));
        let text = error.to_string();
        assert!(text.contains("run-7") && text.contains("event 4"), "{text}");
        assert!(text.contains("tool_exploded"), "{text}");
    }

    #[test]
    fn a_missing_or_mistyped_field_is_malformed_never_a_default() {
        let missing = EventBody::decode("r", 2, "model_response", &json!({"round": 1}));
        let error = missing.unwrap_err();
        assert!(matches!(error, EventDecodeError::Malformed { seq: 2, .. }));
        assert!(error.to_string().contains("tool_calls"), "{error}");

        let secret = "the-prompt-text-that-must-not-travel";
        let mistyped = json!({"round": secret, "text": null, "tool_calls": []});
        let error = EventBody::decode("r", 3, "model_response", &mistyped).unwrap_err();
        assert!(matches!(error, EventDecodeError::Malformed { .. }));
        let text = error.to_string();
        assert!(
            !text.contains(secret),
            "stored values stay out of errors: {text}"
        );
        assert!(text.contains("expected u32"), "{text}");

        let not_an_object = EventBody::decode("r", 5, "run_failed", &json!("failed"));
        assert!(matches!(
            not_an_object,
            Err(EventDecodeError::Malformed { .. })
        ));
        let bad_delivery =
            json!({"round": 1, "error": "e", "retryable": true, "delivery": "perhaps"});
        assert!(matches!(
            EventBody::decode("r", 6, "model_failed", &bad_delivery),
            Err(EventDecodeError::Malformed { .. })
        ));
    }

    #[test]
    fn a_version_this_binary_does_not_read_is_refused() {
        let v2 = json!({"v": 2, "reason": "done"});
        let error = EventBody::decode("r", 9, "run_completed", &v2).unwrap_err();
        assert!(
            matches!(&error, EventDecodeError::UnsupportedVersion { version, .. } if version == "2"),
            "{error:?}"
        );
        let v1 = json!({"v": 1, "reason": "done"});
        assert_eq!(
            EventBody::decode("r", 9, "run_completed", &v1).unwrap(),
            EventBody::RunCompleted(RunEnded {
                reason: "done".into()
            })
        );
    }

    #[test]
    fn the_final_kinds_are_the_ends_of_a_log() {
        assert!(is_final_kind("run_completed") && is_final_kind("run_failed"));
        assert!(is_final_kind("run_stopped"));
        assert!(!is_final_kind("run_requeued") && !is_final_kind("effect_uncertain"));
    }
}
