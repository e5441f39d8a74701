//! The model's steps: its answer in one round, or a call that was cancelled or failed.

use runwarden_models::{FinishReason, ToolCallRequest, Usage};
use runwarden_vault::Delivery;
use serde::{Deserialize, Serialize};

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
