//! The OpenAI-compatible chat completions provider (L1): OpenAI, Ollama, vLLM, llama.cpp.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runwarden_vault::{CancellationSignal, Credential, EgressClient, Placement, SecretName};
use serde_json::{Map, Value, json};

use crate::call::{self, DEFAULT_TIMEOUT};
use crate::error::ModelError;

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
    /// `max_tokens`, when set.
    pub max_tokens: Option<u32>,
}

impl OpenAiCompatible {
    /// A provider with no key, the default timeout and no token cap.
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
        }
    }

    /// The chat completions body for a request.
    fn body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = &request.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.extend(request.messages.iter().map(wire_message));
        let mut body = json!({"model": self.model, "messages": messages, "stream": false});
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
        if let Some(max_tokens) = self.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
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
                            "function": {"name": call.name, "arguments": call.arguments.to_string()},
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
        usage: call::usage(answer, "prompt_tokens", "completion_tokens"),
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
    let arguments = match call.pointer("/function/arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(text)) if text.trim().is_empty() => Value::Object(Map::new()),
        // Invalid arguments are refused rather than replaced by `{}`: running a tool with
        // arguments the model did not mean is worse than failing the turn.
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
            ModelError::Malformed(format!(
                "the arguments of tool call {name:?} are not valid JSON: {e}"
            ))
        })?,
        // Tolerated: a server that sends the object itself.
        Some(other) => other.clone(),
    };
    let arguments = call::arguments_object(arguments).ok_or_else(|| {
        ModelError::Malformed(format!(
            "the arguments of tool call {name:?} are not a JSON object"
        ))
    })?;
    Ok(ToolCallRequest {
        id,
        name: name.to_string(),
        arguments,
    })
}

#[async_trait]
impl ModelProvider for OpenAiCompatible {
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
        );
        if let Some(secret) = &self.api_key {
            egress_request = egress_request.credential(Credential {
                secret: secret.clone(),
                placement: Placement::Bearer,
            });
        }
        let answer = call::send_json(&self.egress, egress_request, signal).await?;
        parse_turn(&answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_tool_arguments_are_malformed_naming_the_tool() {
        let answer = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "tickets__create", "arguments": "{\"title\": "}}
        ]}}]});
        let error = parse_turn(&answer).unwrap_err();
        assert!(matches!(error, ModelError::Malformed(_)));
        assert!(error.to_string().contains("tickets__create"), "{error}");
    }

    #[test]
    fn arguments_that_are_not_an_object_are_malformed() {
        let answer = json!({"choices": [{"message": {"tool_calls": [
            {"id": "c1", "function": {"name": "t", "arguments": "[1, 2]"}}
        ]}}]});
        assert!(matches!(parse_turn(&answer), Err(ModelError::Malformed(_))));
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
