//! The Anthropic Messages provider (L1).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runwarden_vault::{CancellationSignal, Credential, EgressClient, Placement, SecretName};
use serde_json::{Map, Value, json};

use crate::call::{self, DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT, ResponseBody};
use crate::error::ModelError;
use crate::parse;
use crate::provider::{
    FinishReason, Message, ModelProvider, ModelRequest, ModelTurn, ToolCallRequest,
};
use crate::stream::StreamApi;

/// The public Anthropic API root.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";

/// The API version calls name unless [`Anthropic::version`] says otherwise.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A Claude model behind `POST {base_url}/messages`, reached through the vault (L1).
///
/// The API key is a vault secret placed as the `x-api-key` header by the vault; a server
/// that wants none (llama.cpp) leaves `api_key` empty and no credential is placed.
#[derive(Debug, Clone)]
pub struct Anthropic {
    /// The only way out (V3-V7).
    pub egress: Arc<EgressClient>,
    /// The API root, [`ANTHROPIC_BASE_URL`] unless a proxy or a test says otherwise.
    pub base_url: String,
    /// The model name sent with every call.
    pub model: String,
    /// The vault secret holding the API key, if the server wants one.
    pub api_key: Option<SecretName>,
    /// `max_tokens` of every call (the API requires one).
    pub max_tokens: u32,
    /// The total bound of one call.
    pub timeout: Duration,
    /// Stream the answer (L3, the default): a cancel closes the stream and the server
    /// stops generating. False for a server that cannot stream.
    pub stream: bool,
    /// The `anthropic-version` header, [`ANTHROPIC_VERSION`] by default.
    pub version: String,
}

impl Anthropic {
    /// A streaming provider on the public API with the default token cap and timeout.
    /// `api_key` takes a [`SecretName`] or an `Option` of one (none places no credential).
    pub fn new(
        egress: Arc<EgressClient>,
        model: impl Into<String>,
        api_key: impl Into<Option<SecretName>>,
    ) -> Self {
        Self {
            egress,
            base_url: ANTHROPIC_BASE_URL.into(),
            model: model.into(),
            api_key: api_key.into(),
            max_tokens: DEFAULT_MAX_TOKENS,
            timeout: DEFAULT_TIMEOUT,
            stream: true,
            version: ANTHROPIC_VERSION.into(),
        }
    }

    /// The API root.
    pub fn base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// The vault secret of the API key; none places no credential.
    pub fn api_key(mut self, api_key: Option<SecretName>) -> Self {
        self.api_key = api_key;
        self
    }

    /// `max_tokens` of every call; none means [`DEFAULT_MAX_TOKENS`] (L5).
    pub fn max_tokens(mut self, max_tokens: Option<u32>) -> Self {
        self.max_tokens = max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        self
    }

    /// Whether answers stream (L3); true unless the server cannot.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The `anthropic-version` header.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The total bound of one call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The Messages body for a request.
    fn body(&self, request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": request.max_tokens_with(self.max_tokens),
            "messages": wire_messages(&request.messages),
            "stream": self.stream,
        });
        if let Some(system) = &request.system {
            body["system"] = json!(system);
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| {
                    let mut wire = json!({"name": tool.name, "input_schema": tool.input_schema});
                    if let Some(description) = &tool.description {
                        wire["description"] = json!(description);
                    }
                    wire
                })
                .collect();
            body["tools"] = Value::Array(tools);
        }
        body
    }
}

/// Our conversation as Messages turns. Tool results become `tool_result` blocks of a user
/// turn, and consecutive turns of one role are merged into one, because the API wants the
/// roles to alternate and every result of one assistant turn in the user turn after it.
fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message {
            Message::User { text } => ("user", text_block(text).into_iter().collect()),
            Message::Assistant { text, tool_calls } => {
                let mut blocks: Vec<Value> =
                    text.as_deref().and_then(text_block).into_iter().collect();
                blocks.extend(tool_calls.iter().map(|call| {
                    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.echoed_arguments()})
                }));
                ("assistant", blocks)
            }
            Message::Tool {
                call_id,
                content,
                is_error,
                ..
            } => (
                "user",
                vec![
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}),
                ],
            ),
        };
        // The API refuses a turn with no content; an empty one adds nothing anyway.
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// A text block, or none for empty text (the API refuses empty text blocks).
fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// Reads `content[]`: text blocks joined by newlines, `tool_use` blocks as calls; other
/// blocks (thinking and the like) are not for the executor.
fn parse_turn(answer: &Value) -> Result<ModelTurn, ModelError> {
    let blocks = answer
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::Malformed("no content list in the answer".into()))?;
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(text) = block.get("text").and_then(Value::as_str) {
                    texts.push(text);
                }
            }
            Some("tool_use") => {
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| ModelError::Malformed("a tool_use block has no name".into()))?;
                let id = block.get("id").and_then(Value::as_str).ok_or_else(|| {
                    ModelError::Malformed(format!("the tool_use block for {name:?} has no id"))
                })?;
                let input = block
                    .get("input")
                    .cloned()
                    .unwrap_or(Value::Object(Map::new()));
                // L4: an input that is not an object is marked for a tool error.
                let (arguments, invalid_arguments) = parse::arguments_from_value(input);
                tool_calls.push(ToolCallRequest {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments,
                    invalid_arguments,
                });
            }
            _ => {}
        }
    }
    let text = texts.join("\n");
    Ok(ModelTurn {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        // L4, L5: why it stopped and what it used, when the server says.
        finish: answer
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(|r| FinishReason::from(r.to_string())),
        usage: parse::usage(answer, "input_tokens", "output_tokens"),
    })
}

#[async_trait]
impl ModelProvider for Anthropic {
    fn model_name(&self) -> Option<String> {
        Some(self.model.clone())
    }

    fn base_url(&self) -> Option<String> {
        Some(self.base_url.clone())
    }

    fn egress(&self) -> Option<Arc<EgressClient>> {
        Some(self.egress.clone())
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        let mut egress_request = call::model_request(
            call::endpoint(&self.base_url, "messages"),
            &self.body(request),
            self.timeout,
            format!("model anthropic {}", self.model),
            request.correlation.as_deref(),
            self.stream,
        )
        .header("anthropic-version", self.version.as_str());
        if let Some(secret) = &self.api_key {
            egress_request = egress_request.credential(Credential {
                secret: secret.clone(),
                placement: Placement::Header {
                    name: "x-api-key".into(),
                    prefix: None,
                },
            });
        }
        let stream = self
            .stream
            .then(|| (StreamApi::Anthropic, request.progress.clone()));
        let turn = match call::send(&self.egress, egress_request, signal, stream).await? {
            ResponseBody::Json(answer) => parse_turn(&answer)?,
            ResponseBody::Streamed(turn) => turn,
        };
        call::guarded(&self.egress, turn, request.correlation.as_deref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_blocks_are_joined_and_tool_use_blocks_become_calls() {
        let answer = json!({"content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "tickets__search", "input": {"q": "x"}},
            {"type": "text", "text": "Done."},
        ]});
        let turn = parse_turn(&answer).unwrap();
        assert_eq!(turn.text.as_deref(), Some("Looking.\nDone."));
        assert_eq!(turn.tool_calls[0].id, "toolu_1");
        assert_eq!(turn.tool_calls[0].arguments, json!({"q": "x"}));
    }

    #[test]
    fn empty_turns_are_dropped_and_same_role_turns_merge() {
        let messages = [
            Message::User { text: "a".into() },
            Message::Assistant {
                text: None,
                tool_calls: Vec::new(),
            },
            Message::User { text: "b".into() },
        ];
        let wire = wire_messages(&messages);
        assert_eq!(wire.len(), 1);
        assert_eq!(wire[0]["content"].as_array().unwrap().len(), 2);
    }
}
