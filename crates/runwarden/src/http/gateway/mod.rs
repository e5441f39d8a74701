//! G1: the MCP gateway. `runwarden serve` speaks MCP (Streamable HTTP) at `/mcp` to other
//! agents, behind the API's bearer tokens; `[gateway.tokens]` says which tools each token
//! sees. A client's session is a run of its own ([`session`]), and each of its tool calls
//! is made by the executor as an agent's would be: policy, limits, fence, vault, audit,
//! and an operator's cancel.
//!
//! Served: `initialize`, `ping`, `tools/list`, `tools/call` (a JSON answer, or an event
//! stream with the server's progress when the call asks for it), `notifications/cancelled`,
//! and `DELETE` to end a session. No server-initiated stream (`GET` is 405), and no
//! batches. The protected-resource metadata (RFC 9728) says how to authenticate.

pub(crate) mod calls;
mod session;
mod stateless;
mod wire;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runwarden_runtime::StopLevel;
use runwarden_vault::{ApiToken, Role, token_hash, token_verify};
use serde_json::{Value, json};

use super::AppState;
use session::Session;
use wire::{FORBIDDEN, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};

/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// The protocol version header.
const VERSION_HEADER: &str = "mcp-protocol-version";
/// The path of the MCP endpoint.
pub(crate) const MCP_PATH: &str = "/mcp";
/// A session the client has not used for this long, with no call open, is ended.
const IDLE: Duration = Duration::from_secs(30 * 60);
/// The most sessions one token holds open at once (each is a run, and a task).
const SESSIONS_PER_TOKEN: usize = 64;

/// The live sessions of this process, by id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    live: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    /// The gateway's upkeep while the server runs: after a reload each session gets its
    /// token's tools as they now stand (G2), and every minute the sessions their clients
    /// left (no request for a while, no call open) end, so their runs complete.
    pub(crate) fn tend(self: &Arc<Self>, agents: Arc<crate::agents::AgentBuilder>) {
        let refreshing = self.clone();
        tokio::spawn(async move {
            let mut swaps = agents.swaps();
            while swaps.changed().await.is_ok() {
                refreshing.refresh(&agents).await;
            }
        });
        let sweeping = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(60));
            loop {
                every.tick().await;
                sweeping.sweep();
            }
        });
    }

    /// The server stops: every session ends, and its run settles once its calls end
    /// (waited for at most `bound`). Returns how many were still open.
    pub(crate) async fn close_all(&self, bound: Duration) -> usize {
        let sessions: Vec<Arc<Session>> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, session)| session)
            .collect();
        let holders: Vec<_> = sessions.iter().filter_map(|s| s.holder()).collect();
        let open = sessions.len();
        drop(sessions);
        let settled = futures_util::future::join_all(holders);
        if tokio::time::timeout(bound, settled).await.is_err() {
            tracing::warn!(
                open,
                "gateway sessions still had calls when the server stopped; their runs are left to their leases"
            );
        }
        open
    }

    /// G2: after a reload, each session gets its token's tools as they now stand (and its
    /// client hears when they changed); a token no longer listed has its sessions ended.
    async fn refresh(&self, agents: &crate::agents::AgentBuilder) {
        let sessions: Vec<Arc<Session>> = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            live.values().cloned().collect()
        };
        for session in sessions {
            match agents.build_gateway(&session.token_name).await {
                Ok(agent) => session.update(agent),
                Err(error) => {
                    tracing::info!(run = %session.run_id, %error, "a reload ended a gateway session");
                    self.remove(&session.run_id);
                }
            }
        }
    }

    /// How many open sessions the token with this hash holds.
    fn held_by(&self, token: [u8; 32]) -> usize {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.values().filter(|s| s.token == token).count()
    }

    /// Ends every session the client left idle, so their runs settle.
    fn sweep(&self) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, session| !session.idle_for(IDLE));
    }
}

/// The gateway's routes, beside the API's.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route(MCP_PATH, post(post_message).delete(end_session))
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(resource_metadata),
        )
}

/// RFC 9728: what the MCP endpoint is and how to present a token. runwarden issues its
/// own bearer tokens (`runwarden token create`); it names no authorization server.
async fn resource_metadata(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let body = json!({
        "resource": format!("{}{MCP_PATH}", base_url(&state, &headers)),
        "bearer_methods_supported": ["header"],
        "resource_name": "runwarden MCP gateway",
        "resource_documentation": "https://github.com/runwarden/runwarden/blob/main/docs/gateway.md",
    });
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        axum::Json(body),
    )
        .into_response()
}

/// The address clients reached this server by.
fn base_url(state: &AppState, headers: &HeaderMap) -> String {
    let scheme = match state.config.serve.tls {
        Some(_) => "https",
        None => "http",
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or("localhost");
    format!("{scheme}://{host}")
}

/// 401 with the header that points an MCP client at the resource metadata.
fn unauthorized(state: &AppState, headers: &HeaderMap, why: &str) -> Response {
    let metadata = format!(
        "{}/.well-known/oauth-protected-resource/mcp",
        base_url(state, headers)
    );
    let challenge = format!("Bearer resource_metadata=\"{metadata}\"");
    let mut response = (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": {"code": "unauthorized", "message": why}})),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The caller's live token and its hash, or the 401 to answer.
async fn caller(state: &AppState, headers: &HeaderMap) -> Result<(ApiToken, [u8; 32]), Response> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty());
    let Some(presented) = presented else {
        let why = format!(
            "send Authorization: Bearer <token>; `{}` makes one",
            crate::hints::TOKEN_HINT
        );
        return Err(unauthorized(state, headers, &why));
    };
    match token_verify(&*state.tokens, presented).await {
        Ok(Some(token)) => Ok((token, token_hash(presented))),
        Ok(None) => Err(unauthorized(
            state,
            headers,
            "the bearer token is not a live token (unknown or revoked)",
        )),
        Err(error) => Err(super::ApiError::StoreUnavailable(error).into_response()),
    }
}

/// `GET /mcp` from an MCP client (it asks for an event stream): the session's standing
/// stream, on which the gateway says when the client's tools changed. Without a session
/// there is no stream to give (`405`). Any other GET is the console's page of MCP servers.
pub(crate) async fn standing_stream(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers().clone();
    if !accepts_events(&headers) {
        return next.run(request).await;
    }
    if headers.get(SESSION_HEADER).is_none() {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, HeaderValue::from_static("POST, DELETE"))],
        )
            .into_response();
    }
    let (_, token) = match caller(&state, &headers).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let session = match session_of(&state, &headers, token) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    let messages = session.listen();
    // The stream ends when the server drains, so it never holds a stop up.
    let stop = state.stop.clone();
    let stream =
        futures_util::stream::unfold((messages, stop), |(mut messages, mut stop)| async move {
            let stopping = async {
                if stop
                    .wait_for(|level| *level >= StopLevel::Drain)
                    .await
                    .is_err()
                {
                    std::future::pending::<()>().await; // no one can stop the server any more
                }
            };
            let message = tokio::select! {
                message = messages.recv() => message?,
                () = stopping => return None,
            };
            let event = Event::default().event("message").data(message.to_string());
            Some((Ok::<_, Infallible>(event), (messages, stop)))
        });
    Sse::new(stream)
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response()
}

/// `DELETE /mcp`: the client ends its session; its run settles once its calls end.
async fn end_session(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let (_, token) = match caller(&state, &headers).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    match session_of(&state, &headers, token) {
        Ok(session) => {
            state.gateway.remove(&session.run_id);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(refused) => refused.into_response(),
    }
}

/// Why a request names no session of its caller's.
#[derive(Debug, Clone, Copy)]
enum NoSession {
    /// The request has no `Mcp-Session-Id`.
    Missing,
    /// It ended, an operator cancelled it, or another token opened it.
    Unknown,
}

impl IntoResponse for NoSession {
    fn into_response(self) -> Response {
        let (status, why) = match self {
            Self::Missing => (
                StatusCode::BAD_REQUEST,
                "send the Mcp-Session-Id that initialize returned",
            ),
            Self::Unknown => (
                StatusCode::NOT_FOUND,
                "no such session (it ended, or an operator cancelled it); initialize a new one",
            ),
        };
        answer(status, wire::error(&Value::Null, INVALID_REQUEST, why))
    }
}

/// The session the request names, for the token that opened it.
fn session_of(
    state: &AppState,
    headers: &HeaderMap,
    token: [u8; 32],
) -> Result<Arc<Session>, NoSession> {
    let id = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(NoSession::Missing)?;
    match state.gateway.get(id) {
        // Another token's session is not found, rather than forbidden: it says nothing.
        Some(session) if session.token == token => {
            session.seen();
            Ok(session)
        }
        _ => Err(NoSession::Unknown),
    }
}

/// A JSON-RPC answer as an HTTP response.
fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// `POST /mcp`: one JSON-RPC message from the client.
async fn post_message(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let (token, hash) = match caller(&state, &headers).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(message) => message,
        Err(e) => {
            let body = wire::error(
                &Value::Null,
                PARSE_ERROR,
                format!("the body is not JSON: {e}"),
            );
            return answer(StatusCode::BAD_REQUEST, body);
        }
    };
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        if message.is_array() {
            let body = wire::error(
                &Value::Null,
                INVALID_REQUEST,
                "batches are not served: send one message per request",
            );
            return answer(StatusCode::BAD_REQUEST, body);
        }
        // A response to a request of ours: a client's answer to a server's question.
        if let (Some(id), Ok(session)) = (message.get("id"), session_of(&state, &headers, hash)) {
            session.answered(id, message.clone());
        }
        return StatusCode::ACCEPTED.into_response();
    };
    let params = message.get("params").cloned().unwrap_or(json!({}));
    let Some(id) = message.get("id").cloned() else {
        return notification(&state, &headers, hash, method, &params);
    };
    if method == "initialize" {
        return initialize(&state, &token, hash, &id, &params).await;
    }
    if method == "server/discover" {
        return stateless::discover(&id);
    }
    if headers.get(SESSION_HEADER).is_none() && stateless::asked(&headers, &params) {
        return stateless::serve(&state, &headers, (&token, hash), id, (method, params)).await;
    }
    let session = match session_of(&state, &headers, hash) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    if let Some(asked) = headers.get(VERSION_HEADER).and_then(|v| v.to_str().ok())
        && asked != session.version
    {
        let why = format!("this session speaks MCP {}, not {asked}", session.version);
        return answer(
            StatusCode::BAD_REQUEST,
            wire::error(&id, INVALID_REQUEST, why),
        );
    }
    match method {
        "ping" => answer(StatusCode::OK, wire::result(&id, json!({}))),
        "tools/list" => answer(
            StatusCode::OK,
            wire::result(&id, wire::tools(&session.agent())),
        ),
        "tools/call" => call(&state, &headers, &token, session, id, params).await,
        other => answer(
            StatusCode::OK,
            wire::error(
                &id,
                METHOD_NOT_FOUND,
                format!("the gateway does not serve {other}"),
            ),
        ),
    }
}

/// A notification: `notifications/cancelled` stops the call it names; the rest need
/// nothing.
fn notification(
    state: &AppState,
    headers: &HeaderMap,
    token: [u8; 32],
    method: &str,
    params: &Value,
) -> Response {
    if method == "notifications/cancelled"
        && let Ok(session) = session_of(state, headers, token)
        && let Some(request) = params.get("requestId")
    {
        session.cancel(request);
    }
    StatusCode::ACCEPTED.into_response()
}

/// `initialize`: a new session, and its run.
async fn initialize(
    state: &AppState,
    token: &ApiToken,
    hash: [u8; 32],
    id: &Value,
    params: &Value,
) -> Response {
    let agent = match state.agents.build_gateway(&token.name).await {
        Ok(agent) => agent,
        Err(error) => {
            let why = crate::output::one_line(&error);
            return answer(StatusCode::FORBIDDEN, wire::error(id, FORBIDDEN, why));
        }
    };
    state.gateway.sweep();
    if state.gateway.held_by(hash) >= SESSIONS_PER_TOKEN {
        let why = format!(
            "this token holds {SESSIONS_PER_TOKEN} open sessions, the most it may: end one (DELETE /mcp) before opening another"
        );
        return answer(
            StatusCode::TOO_MANY_REQUESTS,
            wire::error(id, FORBIDDEN, why),
        );
    }
    let version = wire::negotiate(params.get("protocolVersion").and_then(Value::as_str));
    let client = client_name(params);
    let answers = session::Answers::declared(&params["capabilities"]);
    let sessions = state.gateway.clone();
    let ended = move |run: &str| {
        sessions.remove(run);
    };
    let opened = Session::open(
        state.executor.clone(),
        agent,
        (hash, &token.name),
        (&client, answers),
        version,
        ended,
    )
    .await;
    let session = match opened {
        Ok(session) => session,
        Err(error) => {
            let why = format!(
                "could not open the session's run: {}",
                crate::output::one_line(&error)
            );
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                wire::error(id, wire::INTERNAL_ERROR, why),
            );
        }
    };
    let run_id = session.run_id.clone();
    state
        .gateway
        .live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(run_id.clone(), session);
    let mut response = answer(StatusCode::OK, wire::result(id, wire::initialized(version)));
    if let Ok(value) = HeaderValue::from_str(&run_id) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// The client's name and version from `clientInfo`, cut to a line.
fn client_name(params: &Value) -> String {
    let info = params.get("clientInfo");
    let field = |key: &str| {
        info.and_then(|i| i.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let text = format!("{} {}", field("name"), field("version"));
    let text: String = runwarden_base::one_line(text.trim())
        .chars()
        .take(120)
        .collect();
    if text.is_empty() {
        "an unnamed client".to_string()
    } else {
        text
    }
}

/// `tools/call`: made through the session's run; with a `progressToken` the answer is an
/// event stream carrying the server's progress first.
async fn call(
    state: &AppState,
    headers: &HeaderMap,
    token: &ApiToken,
    session: Arc<Session>,
    id: Value,
    params: Value,
) -> Response {
    if !token.role.allows(Role::Operator) {
        let why = "a viewer token may list the tools but not call them: it needs the operator role";
        return answer(StatusCode::FORBIDDEN, wire::error(&id, FORBIDDEN, why));
    }
    let Some(tool) = params
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return answer(
            StatusCode::OK,
            wire::error(&id, INVALID_PARAMS, "tools/call needs a tool name"),
        );
    };
    let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
    let progress = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .cloned()
        .filter(|_| accepts_events(headers));
    // An event stream when the client can take one and there is something to say before
    // the answer: the server's progress, or its questions for a client that answers them.
    if progress.is_none() && !(session.answers.any() && accepts_events(headers)) {
        let reply = session.call(&id, tool, arguments, (None, None)).await;
        return finish(state, &session, &id, &reply);
    }
    let (events, received) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let sink = progress.map(|progress| {
        let forward = events.clone();
        runwarden_mcp::NoticeSink::new(move |notice| {
            if let Some(message) = progress_message(&progress, &notice) {
                let _ = forward.send(message);
            }
        })
    });
    let asker = session.answers.any().then(|| {
        Arc::new(session::ClientAsker {
            session: session.clone(),
            events: events.clone(),
        })
    });
    let (state, call_session) = (state.clone(), session.clone());
    tokio::spawn(async move {
        // The call lives as long as the client reads its stream: a client that goes away
        // drops the stream, and the call stops.
        let call = call_session.call(&id, tool, arguments, (sink, asker));
        let reply = tokio::select! {
            reply = call => reply,
            () = events.closed() => return,
        };
        let (message, over) = wire::call_answer(&id, &reply, call_session.version);
        if over {
            state.gateway.remove(&call_session.run_id);
        }
        let _ = events.send(message);
    });
    let stream = futures_util::stream::unfold(received, |mut received| async move {
        let message = received.recv().await?;
        let event = Event::default().event("message").data(message.to_string());
        Some((Ok::<_, Infallible>(event), received))
    });
    Sse::new(stream).into_response()
}

/// The JSON answer of a finished call; a call that ended the run ends the session.
fn finish(
    state: &AppState,
    session: &Session,
    id: &Value,
    reply: &runwarden_runtime::gateway::GatewayReply,
) -> Response {
    let (message, over) = wire::call_answer(id, reply, session.version);
    if over {
        state.gateway.remove(&session.run_id);
    }
    answer(StatusCode::OK, message)
}

/// True when the client takes an event stream as an answer.
fn accepts_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// A server's progress as the client's `notifications/progress`; logs are not forwarded.
fn progress_message(token: &Value, notice: &runwarden_mcp::Notice) -> Option<Value> {
    let runwarden_mcp::Notice::Progress {
        progress,
        total,
        message,
    } = notice
    else {
        return None;
    };
    let mut params = json!({"progressToken": token, "progress": progress});
    if let Some(total) = total {
        params["total"] = json!(total);
    }
    if let Some(message) = message {
        params["message"] = json!(message);
    }
    Some(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}))
}
