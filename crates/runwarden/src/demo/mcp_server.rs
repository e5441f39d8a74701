//! The demo's helpdesk: a small MCP server (Streamable HTTP, stateless JSON) on
//! 127.0.0.1 that reports when a tool call arrives and when its connection closes.
//!
//! `lookup_user` answers at once; `create_ticket` takes [`SLOW_CALL`] to answer, long
//! enough for the demo to cancel it on the wire. The server sees a torn-down transfer as
//! its handler future being dropped before the answer was made: a drop guard inside the
//! handler reports that instant.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// How long `create_ticket` takes to answer.
pub(crate) const SLOW_CALL: Duration = Duration::from_secs(30);

/// The tool that answers at once.
pub(crate) const FAST_TOOL: &str = "lookup_user";
/// The tool that takes [`SLOW_CALL`] to answer.
pub(crate) const SLOW_TOOL: &str = "create_ticket";

/// What the server saw, with the instant it saw it.
#[derive(Debug, Clone)]
pub(crate) enum ServerEvent {
    /// A `tools/call` arrived (its whole body was read).
    CallArrived { tool: String, at: Instant },
    /// The server answered a `tools/call`.
    CallAnswered { tool: String, at: Instant },
    /// The connection of a `tools/call` closed before the server answered.
    CallClosed { tool: String, at: Instant },
    /// The client said it gave up on a request (`notifications/cancelled`).
    CancelledNotice { at: Instant },
}

/// Where the server reports what it saw, as it sees it.
pub(crate) type Sink = Arc<dyn Fn(ServerEvent) + Send + Sync>;

/// The running server. Dropping it stops accepting connections.
pub(crate) struct DemoServer {
    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    sink: Sink,
    slow: Duration,
}

/// Binds 127.0.0.1 on a free port and serves until dropped; `sink` hears every call.
pub(crate) async fn start(slow: Duration, sink: Sink) -> anyhow::Result<DemoServer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("while binding the demo MCP server to 127.0.0.1")?;
    let addr = listener.local_addr()?;
    let router = Router::new()
        .route("/mcp", post(mcp))
        .with_state(Arc::new(Shared { sink, slow }));
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "the demo MCP server stopped");
        }
    });
    Ok(DemoServer {
        url: format!("http://{addr}/mcp"),
        task,
    })
}

/// Reports a `tools/call` whose handler is dropped before it answered: hyper drops the
/// handler's future when the client closes the connection mid-request.
struct CloseWatch<'a> {
    shared: &'a Shared,
    tool: String,
    answered: bool,
}

impl Drop for CloseWatch<'_> {
    fn drop(&mut self) {
        if !self.answered {
            (self.shared.sink)(ServerEvent::CallClosed {
                tool: std::mem::take(&mut self.tool),
                at: Instant::now(),
            });
        }
    }
}

async fn mcp(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        let error = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error: the body is not JSON"}});
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    };
    let method = message["method"].as_str().unwrap_or_default();
    if method.starts_with("notifications/") {
        if method == "notifications/cancelled" {
            (shared.sink)(ServerEvent::CancelledNotice { at: Instant::now() });
        }
        return StatusCode::ACCEPTED.into_response();
    }
    let id = message["id"].clone();
    let outcome = match method {
        "initialize" => Ok(json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "runwarden-demo-helpdesk", "version": env!("CARGO_PKG_VERSION")},
        })),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => Ok(call(&shared, &message["params"]).await),
        other => Err(json!({"code": -32601, "message": format!("method not found: {other}")})),
    };
    let reply = match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        reply.to_string(),
    )
        .into_response()
}

/// One `tools/call`: the result, or a tool error the model reads (never a panic).
async fn call(shared: &Shared, params: &Value) -> Value {
    let tool = params["name"].as_str().unwrap_or_default().to_string();
    let arguments = &params["arguments"];
    (shared.sink)(ServerEvent::CallArrived {
        tool: tool.clone(),
        at: Instant::now(),
    });
    let mut watch = CloseWatch {
        shared,
        tool: tool.clone(),
        answered: false,
    };
    let (text, is_error) = match tool.as_str() {
        FAST_TOOL => {
            let email = arguments["email"].as_str().unwrap_or("someone@example.com");
            (format!("{email}: Ada Lovelace, floor 3, desk 3.14"), false)
        }
        SLOW_TOOL => {
            // The slow back office: the demo cancels the run long before this ends.
            tokio::time::sleep(shared.slow).await;
            let title = arguments["title"].as_str().unwrap_or("untitled");
            (format!("created ticket HD-1042: {title}"), false)
        }
        other => (format!("no tool named {other:?}"), true),
    };
    watch.answered = true;
    (shared.sink)(ServerEvent::CallAnswered {
        tool,
        at: Instant::now(),
    });
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

/// The catalogue `tools/list` answers.
fn tools() -> Value {
    json!([
        {
            "name": FAST_TOOL,
            "description": "Find a user of the helpdesk by email address.",
            "inputSchema": {
                "type": "object",
                "properties": {"email": {"type": "string"}},
                "required": ["email"],
            },
        },
        {
            "name": SLOW_TOOL,
            "description": "Open a helpdesk ticket for a user.",
            "inputSchema": {
                "type": "object",
                "properties": {"user": {"type": "string"}, "title": {"type": "string"}},
                "required": ["user", "title"],
            },
        },
    ])
}
