//! The OpenAI-compatible chat completions provider (L1): OpenAI, Ollama, vLLM, llama.cpp.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runwarden_vault::{CancellationSignal, Credential, EgressClient, Placement, SecretName};
use serde_json::{Map, Value, json};

use crate::call::{self, DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT, ResponseBody};
use crate::error::ModelError;
use crate::parse;
use crate::stream::StreamApi;

use crate::provider::{
    FinishReason, Message, ModelProvider, ModelRequest, ModelTurn, ToolCallRequest,
};

/// A model behind `POST {base_url}/chat/completions`, reached through the vault (L1).
///
/// The API key is a vault secret placed as `Authorization: Bearer` by the vault; a local
/// server without a key (Ollama, llama.cpp) leaves `api_key` empty.
#[derive(Debug, Clone)]
pub struct OpenAiCompatible {
    /// The only way out (V3-V7).
    pub egress: Arc<EgressClient>,
    /// The API root, such as `https://api.openai.com/v1` or `http://localhost:11434/v1`.
    pub base_url: String,
    /// The model name sent with every call.
    pub model: String,
    /// The vault secret holding the API key, if the server wants one.
    pub api_key: Option<SecretName>,
    /// The total bound of one call.
    pub timeout: Duration,
    /// `max_tokens`; [`DEFAULT_MAX_TOKENS`] is sent when unset (L5).
    pub max_tokens: Option<u32>,
    /// Stream the answer (L3, the default): a cancel closes the stream and the server
    /// stops generating. False for a server that cannot stream.
    pub stream: bool,
}

impl OpenAiCompatible {
    /// A streaming provider with no key, the default timeout and the default token cap.
    pub fn new(
        egress: Arc<EgressClient>,
        base_url: impl Into<String>,
        model: impl Into<String>,
    ) -> Self {
        Self {
            egress,
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: DEFAULT_TIMEOUT,
            max_tokens: None,
            stream: true,
        }
    }

    /// The vault secret of the API key; none places no credential.
    pub fn api_key(mut self, api_key: Option<SecretName>) -> Self {
        self.api_key = api_key;
        self
    }

    /// `max_tokens` of every call; none sends [`DEFAULT_MAX_TOKENS`] (L5).
    pub fn max_tokens(mut self, max_tokens: Option<u32>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Whether answers stream (L3); true unless the server cannot.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The total bound of one call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The chat completions body for a request.
    fn body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = &request.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.extend(request.messages.iter().map(wire_message));
        let mut body = json!({"model": self.model, "messages": messages, "stream": self.stream});
        if self.stream {
            // L5: the usage arrives in a last chunk only when asked for.
            body["stream_options"] = json!({"include_usage": true});
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| {
                    let mut function = json!({"name": tool.name, "parameters": tool.input_schema});
                    if let Some(description) = &tool.description {
                        function["description"] = json!(description);
                    }
                    json!({"type": "function", "function": function})
                })
                .collect();
            body["tools"] = Value::Array(tools);
        }
        // L5: a local server's default is often unlimited.
        body["max_tokens"] =
            json!(request.max_tokens_with(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)));
        body
    }
}

fn wire_message(message: &Message) -> Value {
    match message {
        Message::User { text } => json!({"role": "user", "content": text}),
        Message::Assistant { text, tool_calls } => {
            let mut wire = json!({"role": "assistant", "content": text});
            if !tool_calls.is_empty() {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            // The API carries arguments as a JSON string, not an object.
                            "function": {"name": call.name, "arguments": call.echoed_arguments().to_string()},
                        })
                    })
                    .collect();
                wire["tool_calls"] = Value::Array(calls);
            } else if text.is_none() {
                wire["content"] = json!("");
            }
            wire
        }
        // The API has no error flag on a tool message; the content says what happened.
        Message::Tool {
            call_id, content, ..
        } => {
            json!({"role": "tool", "tool_call_id": call_id, "content": content})
        }
    }
}

/// Reads `choices[0].message`: its text and its tool calls.
fn parse_turn(answer: &Value) -> Result<ModelTurn, ModelError> {
    let message = answer
        .pointer("/choices/0/message")
        .ok_or_else(|| ModelError::Malformed("no choices[0].message in the answer".into()))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers answer with content parts; the text parts are what we read.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        Some(_) => {
            return Err(ModelError::Malformed(
                "choices[0].message.content is neither text nor parts".into(),
            ));
        }
    }
    .filter(|t| !t.is_empty());
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(n, call)| parse_tool_call(n, call))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ModelError::Malformed(
                "choices[0].message.tool_calls is not a list".into(),
            ));
        }
    };
    Ok(ModelTurn {
        text,
        tool_calls,
        // L4, L5: why it stopped and what it used, when the server says.
        finish: answer
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            .map(|r| FinishReason::from(r.to_string())),
        usage: parse::usage(answer, "prompt_tokens", "completion_tokens"),
    })
}

fn parse_tool_call(n: usize, call: &Value) -> Result<ToolCallRequest, ModelError> {
    let name = call
        .pointer("/function/name")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| {
            ModelError::Malformed(format!("tool call {} has no function name", n + 1))
        })?;
    // Some local servers omit the id; the result message still needs one to echo.
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("call-{}", n + 1), str::to_string);
    // L4: arguments that are not a JSON object are marked, never replaced by `{}` (running
    // a tool with arguments the model did not mean) and never a failed turn: the model
    // reads a tool error and may try again.
    let (arguments, invalid_arguments) = match call.pointer("/function/arguments") {
        None => (Value::Object(Map::new()), None),
        Some(Value::String(text)) => parse::arguments_from_text(text),
        // Tolerated: a server that sends the object itself.
        Some(other) => parse::arguments_from_value(other.clone()),
    };
    Ok(ToolCallRequest {
        id,
        name: name.to_string(),
        arguments,
        invalid_arguments,
    })
}

#[async_trait]
impl ModelProvider for OpenAiCompatible {
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
            call::endpoint(&self.base_url, "chat/completions"),
            &self.body(request),
            self.timeout,
            format!("model openai {}", self.model),
            request.correlation.as_deref(),
            self.stream,
        );
        if let Some(secret) = &self.api_key {
            egress_request = egress_request.credential(Credential {
                secret: secret.clone(),
                placement: Placement::Bearer,
            });
        }
        let stream = self
            .stream
            .then(|| (StreamApi::OpenAi, request.progress.clone()));
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
    fn invalid_tool_arguments_are_marked_without_their_text_and_the_turn_stands() {
        let answer = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "tickets__create", "arguments": "{\"title\": \"sec"}}
        ]}}]});
        let turn = parse_turn(&answer).unwrap();
        let call = &turn.tool_calls[0];
        assert_eq!(call.arguments, Value::Null, "L4: never a silent {{}}");
        let why = call.invalid_arguments.as_deref().unwrap();
        assert!(why.contains("line 1 column"), "{why}");
        assert!(!why.contains("sec"), "the model's text stays out: {why}");
    }

    #[test]
    fn arguments_that_are_not_an_object_are_marked() {
        let answer = json!({"choices": [{"message": {"tool_calls": [
            {"id": "c1", "function": {"name": "t", "arguments": "[1, 2]"}}
        ]}}]});
        let turn = parse_turn(&answer).unwrap();
        assert_eq!(
            turn.tool_calls[0].invalid_arguments.as_deref(),
            Some("expected a JSON object, got an array")
        );
    }

    #[test]
    fn empty_arguments_and_a_missing_id_are_tolerated() {
        let answer = json!({"choices": [{"message": {"content": "", "tool_calls": [
            {"function": {"name": "t", "arguments": ""}}
        ]}}]});
        let turn = parse_turn(&answer).unwrap();
        assert_eq!(turn.text, None);
        assert_eq!(turn.tool_calls[0].id, "call-1");
        assert_eq!(turn.tool_calls[0].arguments, json!({}));
    }

    #[test]
    fn an_answer_without_choices_is_malformed() {
        assert!(matches!(
            parse_turn(&json!({"choices": []})),
            Err(ModelError::Malformed(_))
        ));
    }
}
