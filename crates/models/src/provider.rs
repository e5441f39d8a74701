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
