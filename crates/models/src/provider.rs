//! The provider seam: one model turn from a conversation, through the vault, cancellable.

use std::sync::Arc;

use async_trait::async_trait;
use runwarden_vault::{CancellationSignal, EgressClient};
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
    /// The arguments object (an object even when the model sent none), or `null` when
    /// they could not be read (see `invalid_arguments`).
    pub arguments: Value,
    /// Set when the model's arguments were not a JSON object (not valid JSON, or JSON of
    /// another type): the parser's message, such as `EOF while parsing an object at line 1
    /// column 12` (positions only, never the model's text). `arguments` is then `null`.
    /// The call is not to be run: the model gets a tool error ("arguments were not valid
    /// JSON: ...") and may try again (L4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_arguments: Option<String>,
}

impl ToolCallRequest {
    /// A call with valid arguments.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments,
            invalid_arguments: None,
        }
    }

    /// The arguments as the API's history wants them echoed: an object, `{}` for
    /// arguments that could not be read (the tool error that follows says why).
    pub(crate) fn echoed_arguments(&self) -> Value {
        match &self.arguments {
            Value::Object(_) => self.arguments.clone(),
            _ => Value::Object(Default::default()),
        }
    }
}

/// Told the output deltas a streamed model call has received so far (about one per
/// token: text, reasoning and tool-argument fragments), once per delta, from inside the
/// transfer. It must be cheap and never block: count, compare, maybe wake a throttled
/// publisher. A streamed call reports; a non-streamed one does not.
#[derive(Clone)]
pub struct Progress(Arc<dyn Fn(u64) + Send + Sync>);

impl Progress {
    /// Wraps `report`, called with the running count.
    pub fn new(report: impl Fn(u64) + Send + Sync + 'static) -> Self {
        Self(Arc::new(report))
    }

    /// Reports `deltas` so far.
    pub fn report(&self, deltas: u64) {
        (self.0)(deltas);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl PartialEq for Progress {
    /// The same callback.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
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
    /// Told the output deltas so far while the answer streams (L3, R13 budgets).
    pub progress: Option<Progress>,
    /// At most this many output tokens for this call: lowers the provider's own
    /// `max_tokens`, never raises it (the run's remaining token budget, R13).
    pub max_tokens: Option<u32>,
}

impl ModelRequest {
    /// The `max_tokens` to send: the provider's, lowered by the request's.
    pub fn max_tokens_with(&self, provider: u32) -> u32 {
        self.max_tokens.map_or(provider, |cap| cap.min(provider))
    }
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

    /// The model's name, as a policy names it (`Model::"NAME"`); `None` when it has none.
    fn model_name(&self) -> Option<String> {
        None
    }

    /// The API root calls go to, whose host a policy reads (`context.host`); `None` when
    /// nothing leaves.
    fn base_url(&self) -> Option<String> {
        None
    }

    /// The egress client its calls leave through (and whose vault keeps their audit rows),
    /// when it has one.
    fn egress(&self) -> Option<Arc<EgressClient>> {
        None
    }
}
