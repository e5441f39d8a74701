//! A scripted MCP server on 127.0.0.1: each test says how it behaves, method by method.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runwarden_mcp::ManualClock;
use runwarden_testkit::{HttpReply, HttpRequest, TestServer};
use serde_json::{Value, json};

/// The two connection profiles every conformance check runs under.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    /// Issue an `Mcp-Session-Id` (and require it back).
    pub sessions: bool,
    /// Frame responses as `text/event-stream` (with a server notification first).
    pub sse: bool,
}

pub const STATELESS_JSON: Profile = Profile {
    sessions: false,
    sse: false,
};
pub const SESSION_SSE: Profile = Profile {
    sessions: true,
    sse: true,
};

/// A response shape that is wrong in one particular way (M5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    ServerError,
    Redirect,
    Unauthorized,
    RpcError,
    HtmlPage,
    StreamWithoutOurResponse,
    NeitherResultNorError,
    EmptyBody,
    Huge,
}

/// How the server behaves.
#[derive(Clone)]
pub struct Script {
    pub profile: Profile,
    pub version: String,
    pub offers_tools: bool,
    pub pages: Vec<Vec<Value>>,
    pub endless_pages: bool,
    pub clock: Option<Arc<ManualClock>>,
    pub advance: HashMap<&'static str, Duration>,
    pub stall: Option<&'static str>,
    pub fail: Option<(&'static str, Shape)>,
    pub expire_once: Option<&'static str>,
    pub call_result: Value,
}

impl Script {
    pub fn new(profile: Profile) -> Self {
        Self {
            profile,
            version: "2025-11-25".into(),
            offers_tools: true,
            pages: vec![vec![tool("search"), tool("create")]],
            endless_pages: false,
            clock: None,
            advance: HashMap::new(),
            stall: None,
            fail: None,
            expire_once: None,
            call_result: json!({"content": [{"type": "text", "text": "done"}]}),
        }
    }
}

/// A tool definition with a small object schema.
pub fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("the {name} tool"),
           "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}})
}

/// The JSON-RPC method of a recorded request.
pub fn method_of(request: &HttpRequest) -> String {
    serde_json::from_slice::<Value>(&request.body)
        .ok()
        .and_then(|v| v["method"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The parsed JSON-RPC body of a recorded request.
pub fn body_of(request: &HttpRequest) -> Value {
    serde_json::from_slice(&request.body).unwrap_or(Value::Null)
}

#[derive(Default)]
struct State {
    session: Option<String>,
    sessions_issued: usize,
    expired: bool,
}

const SESSION_PREFIX: &str = "session-";

/// Starts the scripted server.
pub async fn start(script: Script) -> TestServer {
    let state = Arc::new(Mutex::new(State::default()));
    TestServer::start(move |request| answer(&script, &state, request)).await
}

fn frame(profile: Profile, message: Value) -> HttpReply {
    if profile.sse {
        let body = format!(
            "event: message\ndata: {}\n\nevent: message\ndata: {}\n\n",
            json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}}),
            message
        );
        HttpReply::typed(200, "text/event-stream", body)
    } else {
        HttpReply::json(200, &message)
    }
}

fn answer(script: &Script, state: &Mutex<State>, request: &HttpRequest) -> HttpReply {
    let body = body_of(request);
    let method = body["method"].as_str().unwrap_or_default().to_string();
    let id = body.get("id").cloned();
    let mut state = state.lock().unwrap();

    if let (Some(clock), Some(by)) = (&script.clock, script.advance.get(method.as_str())) {
        clock.advance(*by);
    }
    if script.profile.sessions && method != "initialize" {
        match request.header("mcp-session-id") {
            None => return HttpReply::text(400, "missing session"),
            Some(sent) if Some(sent) != state.session.as_deref() => {
                return HttpReply::text(404, "unknown session");
            }
            Some(_) => {}
        }
    }
    // A server that offers no standalone GET stream (M14); resumption GETs are scripted
    // below.
    if request.method == "GET" && request.header("last-event-id").is_none() {
        return HttpReply::text(405, "no standalone stream here");
    }
    if script.stall == Some(method.as_str()) {
        return HttpReply::Stall;
    }
    if script.expire_once == Some(method.as_str())
        && !state.expired
        && request.header("mcp-session-id").is_some()
    {
        state.expired = true;
        state.session = None;
        return HttpReply::text(404, "session expired");
    }
    if let Some((failing, shape)) = script.fail
        && failing == method
    {
        return failure(script.profile, shape, id);
    }
    if method.starts_with("notifications/") {
        return HttpReply::Respond {
            status: 202,
            headers: vec![],
            body: vec![],
        };
    }
    let result = match method.as_str() {
        "initialize" => {
            let mut capabilities = json!({});
            if script.offers_tools {
                capabilities["tools"] = json!({});
            }
            json!({"protocolVersion": script.version, "capabilities": capabilities,
                   "serverInfo": {"name": "scripted", "version": "1"}})
        }
        "tools/list" => {
            let cursor = body["params"]["cursor"]
                .as_str()
                .and_then(|c| c.strip_prefix("page-"))
                .and_then(|n| n.parse::<usize>().ok());
            let page = cursor.unwrap_or(0);
            let tools = if script.endless_pages {
                vec![tool(&format!("t{page}"))]
            } else {
                script.pages.get(page).cloned().unwrap_or_default()
            };
            let more = script.endless_pages || page + 1 < script.pages.len();
            let mut result = json!({"tools": tools});
            if more {
                result["nextCursor"] = json!(format!("page-{}", page + 1));
            }
            result
        }
        "tools/call" => script.call_result.clone(),
        "ping" => json!({}),
        other => {
            return frame(
                script.profile,
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("no method {other}")}}),
            );
        }
    };
    let mut reply = frame(
        script.profile,
        json!({"jsonrpc": "2.0", "id": id, "result": result}),
    );
    if method == "initialize" && script.profile.sessions {
        state.sessions_issued += 1;
        let session = format!("{SESSION_PREFIX}{}", state.sessions_issued);
        state.session = Some(session.clone());
        reply = reply.with_header("mcp-session-id", &session);
    }
    reply
}

/// The filler of the oversized body; it must never show up in an error.
pub const HUGE_FILLER: &str = "FILLER-never-echo-";

fn failure(profile: Profile, shape: Shape, id: Option<Value>) -> HttpReply {
    match shape {
        Shape::ServerError => HttpReply::text(503, "unavailable"),
        Shape::Redirect => {
            HttpReply::text(302, "").with_header("location", "http://169.254.169.254/")
        }
        Shape::Unauthorized => HttpReply::text(401, "who are you"),
        Shape::RpcError => frame(
            profile,
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "backend\nexploded"}}),
        ),
        Shape::HtmlPage => HttpReply::typed(
            200,
            "text/html; charset=utf-8",
            "<html><body>Sign in</body></html>",
        ),
        Shape::StreamWithoutOurResponse => HttpReply::typed(
            200,
            "text/event-stream",
            format!(
                "event: message\ndata: {}\n\n",
                json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {}})
            ),
        ),
        Shape::NeitherResultNorError => HttpReply::typed(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": id}).to_string(),
        ),
        Shape::EmptyBody => HttpReply::typed(200, "application/json", ""),
        Shape::Huge => {
            let filler = HUGE_FILLER.repeat(3 * 1024 * 1024 / HUGE_FILLER.len() + 1);
            HttpReply::typed(
                200,
                "application/json",
                format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":\"{filler}\"}}",
                    id.unwrap_or(Value::Null)
                ),
            )
        }
    }
}
