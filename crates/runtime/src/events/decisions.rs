//! The decision events: a question asked of an operator, and its answer.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{Answer, Decision, DecisionKind};

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
