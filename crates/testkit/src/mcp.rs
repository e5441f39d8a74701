//! A minimal stateless MCP server for tests that need one but not its edge cases: it
//! answers `initialize`, accepts notifications, lists the given tools and echoes calls,
//! except the tools named to stall, which never answer.

use serde_json::{Value, json};

use crate::server::{HttpReply, HttpRequest};

/// A handler for [`TestServer::start`](crate::TestServer::start).
pub fn mcp_handler(
    tools: Vec<Value>,
    stalling: &[&str],
) -> impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static {
    let stalling: Vec<String> = stalling.iter().map(|s| s.to_string()).collect();
    move |request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let method = body["method"].as_str().unwrap_or_default();
        if method.starts_with("notifications/") {
            return HttpReply::Respond {
                status: 202,
                headers: vec![],
                body: vec![],
            };
        }
        let result = match method {
            "initialize" => {
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "testkit", "version": "1"}})
            }
            "tools/list" => json!({"tools": tools}),
            "tools/call" => {
                let name = body["params"]["name"].as_str().unwrap_or_default();
                if stalling.iter().any(|s| s == name) {
                    return HttpReply::Stall;
                }
                let text = format!("{name} {}", body["params"]["arguments"]);
                json!({"content": [{"type": "text", "text": text}]})
            }
            _ => json!({}),
        };
        HttpReply::typed(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string(),
        )
    }
}

/// A tool definition with a one-string-argument object schema.
pub fn tool(name: &str) -> Value {
    json!({"name": name, "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}})
}
