//! The provider seam: one model turn from a conversation, through the vault, cancellable.

use async_trait::async_trait;
use runwarden_vault::CancellationSignal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ModelError;

/// A tool the model may call: its local name, description and normalised input schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The provider-valid local name (`server__tool`).
    pub name: String,
    /// What the tool does.
    pub description: Option<String>,
    /// A JSON Schema object with `type: object` at the top.
    pub input_schema: Value,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The provider's id for the call, echoed in the result message.
    pub id: String,
    /// The tool's local name.
    pub name: String,
    /// The arguments object (an object even when the model sent none).
    pub arguments: Value,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// The user's prompt.
    User {
        /// The text.
        text: String,
    },
    /// What the model answered before: text, tool calls, or both.
    Assistant {
        /// Text, if any.
        text: Option<String>,
        /// Tool calls, if any.
        tool_calls: Vec<ToolCallRequest>,
    },
    /// The result of one tool call.
    Tool {
        /// The id of the call this answers.
        call_id: String,
        /// The tool's local name.
        name: String,
        /// The text the model reads.
        content: String,
        /// True when the call failed or the tool reported an error.
        is_error: bool,
    },
}

/// What one model call is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The system prompt.
    pub system: Option<String>,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// The tools on offer.
    pub tools: Vec<ToolSpec>,
    /// A correlation for the audit rows (the run id).
    pub correlation: Option<String>,
}

/// One model turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelTurn {
    /// Text, if any.
    pub text: Option<String>,
    /// Tool calls, if any; none means the model is done.
    pub tool_calls: Vec<ToolCallRequest>,
    /// Why the model stopped (L4), when the server said; a truncated turn
    /// ([`FinishReason::Length`]) is never a final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<FinishReason>,
    /// The tokens this call used (L5), when the server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ModelTurn {
    /// A turn with text and tool calls and nothing said about why it ended or its usage
    /// (a scripted turn).
    pub fn new(text: Option<String>, tool_calls: Vec<ToolCallRequest>) -> Self {
        Self {
            text,
            tool_calls,
            finish: None,
            usage: None,
        }
    }
}

/// Why a model stopped generating (L4), as the API said it, normalised across providers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum FinishReason {
    /// A natural end (`stop`, `end_turn`, `stop_sequence`).
    Stop,
    /// The model asked for tools (`tool_calls`, `tool_use`).
    ToolCalls,
    /// The output limit cut the answer (`length`, `max_tokens`).
    Length,
    /// A content filter stopped it (`content_filter`).
    ContentFilter,
    /// The model refused (`refusal`).
    Refusal,
    /// Anything else, as the server named it.
    Other(String),
}

impl FinishReason {
    /// The stable name stored in events (`stop`, `tool_calls`, `length`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::Length => "length",
            Self::ContentFilter => "content_filter",
            Self::Refusal => "refusal",
            Self::Other(name) => name,
        }
    }
}

impl From<String> for FinishReason {
    /// Both providers' names: OpenAI's `finish_reason` and Anthropic's `stop_reason`.
    fn from(name: String) -> Self {
        match name.as_str() {
            "stop" | "end_turn" | "stop_sequence" => Self::Stop,
            "tool_calls" | "tool_use" | "function_call" => Self::ToolCalls,
            "length" | "max_tokens" => Self::Length,
            "content_filter" => Self::ContentFilter,
            "refusal" => Self::Refusal,
            _ => Self::Other(name),
        }
    }
}

impl From<FinishReason> for String {
    fn from(reason: FinishReason) -> Self {
        reason.as_str().to_string()
    }
}

/// Tokens one model call used (L5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
}

/// A model provider. Every call goes through the vault's egress with the caller's signal
/// (L1), so a cancel also aborts a model call in flight.
#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// One turn: the model's answer to the conversation so far.
    async fn complete(
        &self,
        request: &ModelRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError>;
}
