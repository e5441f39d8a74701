//! What the gateway says on the wire: JSON-RPC answers, the `initialize` result, the
//! catalogue as `tools/list` gives it, and a call's result.

use runwarden_mcp::Effect;
use runwarden_runtime::gateway::GatewayReply;
use runwarden_runtime::{AgentSpec, Outcome};
use serde_json::{Value, json};

/// JSON-RPC: the request is not valid.
pub(crate) const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: the parameters are not valid.
pub(crate) const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC: the server failed.
pub(crate) const INTERNAL_ERROR: i64 = -32603;
/// JSON-RPC: the body is not JSON.
pub(crate) const PARSE_ERROR: i64 = -32700;
/// The request was cancelled (the code LSP and MCP SDKs use for it).
pub(crate) const REQUEST_CANCELLED: i64 = -32800;
/// The token may not do this (an implementation-defined server error).
pub(crate) const FORBIDDEN: i64 = -32001;

/// The versions of the `initialize` handshake the gateway serves, newest first.
pub(crate) const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// A JSON-RPC result.
pub(crate) fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error.
pub(crate) fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// The version the session speaks: the client's when the gateway serves it, else the
/// newest (the client then decides whether it can go on).
pub(crate) fn negotiate(asked: Option<&str>) -> &'static str {
    VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .copied()
        .unwrap_or(VERSIONS[0])
}

/// The `initialize` result.
pub(crate) fn initialized(version: &str) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": true}},
        "serverInfo": {"name": "runwarden", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Tools of the MCP servers runwarden holds credentials for. Every call is checked by policy, may wait for an operator, and is audited; an operator can cancel it.",
    })
}

/// `tools/list`: the session's tools by local name, their effects as annotations (the
/// operator's declaration, which decides the write fence, not the server's hints).
pub(crate) fn tools(agent: &AgentSpec) -> Value {
    let tools: Vec<Value> = agent
        .tools
        .iter()
        .map(|tool| {
            let mut entry = json!({
                "name": tool.spec.name,
                "inputSchema": tool.spec.input_schema,
                "annotations": annotations(tool.effect),
            });
            if let Some(description) = &tool.spec.description {
                entry["description"] = json!(description);
            }
            if let Some(schema) = &tool.output_schema {
                entry["outputSchema"] = schema.clone();
            }
            entry
        })
        .collect();
    json!({ "tools": tools })
}

/// The protocol's hints for an effect.
fn annotations(effect: Effect) -> Value {
    match effect {
        Effect::ReadOnly => json!({"readOnlyHint": true}),
        Effect::IdempotentWrite => {
            json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true})
        }
        Effect::NonIdempotentWrite => {
            json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false})
        }
    }
}

/// The answer to a `tools/call` in `version`, and whether the session is over.
pub(crate) fn call_answer(id: &Value, reply: &GatewayReply, version: &str) -> (Value, bool) {
    let (mut message, over) = call_message(id, reply);
    // The stateless revision says what a result is.
    if version == super::stateless::STATELESS && message["result"].is_object() {
        message["result"]["resultType"] = json!("complete");
    }
    (message, over)
}

fn call_message(id: &Value, reply: &GatewayReply) -> (Value, bool) {
    match reply {
        GatewayReply::Result {
            text,
            structured,
            content,
            is_error,
        } => {
            // The server's own blocks when it answered; runwarden's words otherwise.
            let content = match content.is_empty() {
                true => json!([{"type": "text", "text": text}]),
                false => json!(content),
            };
            let mut body = json!({"content": content, "isError": is_error});
            if let Some(structured) = structured {
                body["structuredContent"] = structured.clone();
            }
            (result(id, body), false)
        }
        GatewayReply::CancelledByOperator { uncertain } => {
            let message = match uncertain {
                true => {
                    "cancelled by an operator; the outcome is unknown: the write may have taken effect, so do not retry it until a person has checked"
                }
                false => "cancelled by an operator",
            };
            (error(id, REQUEST_CANCELLED, message), false)
        }
        GatewayReply::CancelledByClient { uncertain } => {
            let message = match uncertain {
                true => {
                    "cancelled by the client; the write may have taken effect and is not retried"
                }
                false => "cancelled by the client",
            };
            (error(id, REQUEST_CANCELLED, message), false)
        }
        GatewayReply::Ended { outcome, uncertain } => {
            let (code, said) = match outcome {
                Outcome::Cancelled => (REQUEST_CANCELLED, "cancelled by an operator".to_string()),
                other => (
                    INTERNAL_ERROR,
                    format!("the gateway session ended ({})", other.as_str()),
                ),
            };
            let message = match uncertain {
                true => format!(
                    "{said}; the outcome is unknown: the write may have taken effect, so do not retry it until a person has checked"
                ),
                false => format!("{said}; start a new session to go on"),
            };
            (error(id, code, message), true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_the_gateway_does_not_serve_gets_the_newest() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2024-11-05")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
    }

    #[test]
    fn an_operator_cancel_is_a_cancelled_error_and_an_unknown_write_says_so() {
        let id = json!(7);
        let ended = GatewayReply::Ended {
            outcome: Outcome::Cancelled,
            uncertain: true,
        };
        let (answer, over) = call_answer(&id, &ended, "2025-11-25");
        assert!(over);
        assert_eq!(answer["error"]["code"], REQUEST_CANCELLED);
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("cancelled by an operator"), "{message}");
        assert!(message.contains("outcome is unknown"), "{message}");
        assert!(!message.contains("safe to retry"), "{message}");
    }

    #[test]
    fn a_result_keeps_its_structured_content() {
        let reply = GatewayReply::Result {
            text: "3".into(),
            structured: Some(json!({"sum": 3})),
            content: vec![
                json!({"type": "text", "text": "3"}),
                json!({"type": "image", "data": "AA==", "mimeType": "image/png"}),
            ],
            is_error: false,
        };
        let (answer, over) = call_answer(&json!("a"), &reply, "2025-11-25");
        assert!(!over);
        assert_eq!(answer["result"]["structuredContent"]["sum"], 3);
        assert_eq!(answer["result"]["content"][0]["text"], "3");
        assert_eq!(
            answer["result"]["content"][1]["type"], "image",
            "blocks pass whole"
        );
        assert_eq!(answer["result"]["isError"], false);
    }
}
