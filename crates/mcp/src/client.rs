//! The MCP client: the handshake, the three places a signal enters, and every leg sent
//! through the vault's guarded egress client.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientCapabilities, Implementation,
    InitializeRequestParams, InitializeResult, NumberOrString, PaginatedRequestParams,
    ProtocolVersion,
};
use runwarden_vault::{
    CancellationSignal, Delivery, EgressClient, EgressError, EgressRequest, EgressResponse, Method,
};
use serde_json::{Map, Value, json};

use crate::catalogue::{CatalogueStore, Contact};
use crate::config::ServerConfig;
use crate::deadline::{Clock, Deadline, SystemClock};
use crate::error::{McpError, one_line};
use crate::result::ToolResult;
use crate::sse;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The protocol versions this client negotiates, newest first (M2).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["2025-11-25", "2025-06-18"];

/// The most of a response body that is read (M5).
pub const MAX_RESPONSE_BYTES: usize = 2 * 1024 * 1024;

/// The most `tools/list` pages one discovery walks (M6).
pub const MAX_PAGES: usize = 50;

/// The budget of the best-effort `notifications/cancelled` after a torn-down call (M4).
pub const CANCEL_NOTICE_BUDGET: Duration = Duration::from_secs(2);

/// A request operation other than a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// Walk `tools/list` to the end (M6).
    ListTools,
    /// `ping`.
    Ping,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Reply {
    /// Every tool the server listed, in order.
    Tools(Vec<ListedTool>),
    /// The server answered the ping.
    Pong,
}

/// A notification operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notification {
    /// `notifications/cancelled` for a request of ours.
    Cancelled {
        /// The JSON-RPC id of the request.
        request_id: i64,
        /// Why, for the server's log.
        reason: String,
    },
}

/// A tool as the server listed it, before normalisation.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedTool {
    /// The remote name.
    pub name: String,
    /// The server's description, if any.
    pub description: Option<String>,
    /// The input schema as sent.
    pub input_schema: Value,
}

/// What a [`CallGate`] returns: `Err` with the reason refuses the call.
pub type GateFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Runs once the session is ready, after the vault committed the audit intent of
/// `tools/call` and just before its first byte leaves; an `Err` stops the call unsent. The runtime stamps its write fence here (R11), so a
/// crash during the handshake never leaves a run fenced for a write that never left.
#[derive(Clone)]
pub struct CallGate(Arc<dyn Fn() -> GateFuture + Send + Sync>);

impl CallGate {
    /// A gate from a function that returns the future to await.
    pub fn new(gate: impl Fn() -> GateFuture + Send + Sync + 'static) -> Self {
        Self(Arc::new(gate))
    }
}

impl std::fmt::Debug for CallGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallGate")
    }
}

/// One `tools/call`.
#[derive(Debug, Clone, Default)]
pub struct ToolCallRequest {
    /// The remote tool name (what goes on the wire).
    pub tool: String,
    /// The arguments object.
    pub arguments: Map<String, Value>,
    /// A correlation for the audit rows (a run id).
    pub correlation: Option<String>,
    /// Asked after the handshake and before `tools/call` is sent, if set.
    pub gate: Option<CallGate>,
    /// Answers the server's `elicitation/create` during this call (M14); with none, the
    /// client declines at once.
    pub elicitor: Option<crate::ElicitorHandle>,
}

/// One HTTP exchange of an operation, for reports and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegReport {
    /// The JSON-RPC method.
    pub method: String,
    /// The bound the leg was sent with.
    pub granted: Duration,
    /// How long it took.
    pub elapsed: Duration,
    /// True when the leg got an HTTP answer.
    pub answered: bool,
    /// The id of the leg's intent row in the audit log, once it was committed (V7).
    pub audit_id: Option<i64>,
}

/// The result of [`McpClient::call_tool`] with the legs it took.
#[derive(Debug)]
pub struct ToolCall {
    /// What the model sees.
    pub result: ToolResult,
    /// Every leg of the operation, in order.
    pub legs: Vec<LegReport>,
    /// The JSON-RPC id of the `tools/call`, once one was sent.
    pub request_id: Option<i64>,
}

/// What the handshake negotiated.
#[derive(Debug)]
struct Session {
    /// `Mcp-Session-Id`, only when the server issued one.
    id: Option<String>,
    /// The negotiated version, sent as `MCP-Protocol-Version` on every later leg.
    protocol: String,
    /// Whether the server offers tools.
    tools: bool,
}

/// One operation: its deadline, the caller's signal and the legs so far.
struct Operation<'a> {
    deadline: Deadline<'a>,
    signal: Option<&'a dyn CancellationSignal>,
    correlation: Option<String>,
    legs: Mutex<Vec<LegReport>>,
}

impl Operation<'_> {
    fn legs(self) -> Vec<LegReport> {
        self.legs.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// An MCP server over Streamable HTTP (M1), reached only through the vault.
///
/// A signal enters in exactly three places (M4): [`call_tool`](Self::call_tool),
/// [`send_request`](Self::send_request) and [`send_notification`](Self::send_notification).
/// Each passes it to every leg of its operation, handshake included.
pub struct McpClient {
    server: ServerConfig,
    egress: Arc<EgressClient>,
    clock: Arc<dyn Clock>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    next_id: AtomicI64,
    actor: String,
    health: Option<Arc<dyn CatalogueStore>>,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("server", &self.server.name)
            .finish_non_exhaustive()
    }
}

/// A leg's answer: the response message (for requests) and the HTTP headers.
struct Answer {
    message: Option<Value>,
    response: EgressResponse,
}

impl McpClient {
    /// A client for one server, on the system's monotonic clock.
    pub fn new(server: ServerConfig, egress: Arc<EgressClient>) -> Self {
        Self {
            server,
            egress,
            clock: Arc::new(SystemClock::default()),
            session: tokio::sync::Mutex::new(None),
            next_id: AtomicI64::new(1),
            actor: "mcp".into(),
            health: None,
        }
    }

    /// Records each operation's outcome as the server's liveness (M11).
    pub fn with_health(mut self, store: Arc<dyn CatalogueStore>) -> Self {
        self.health = Some(store);
        self
    }

    /// M11: a success or a failure per operation; a cancellation is neither, because it
    /// says nothing about the server.
    async fn record_contact(&self, outcome: Result<(), &McpError>) {
        let Some(store) = &self.health else { return };
        let at_ms = now_ms();
        let contact = match outcome {
            Ok(()) => Contact::Success { at_ms },
            Err(error) if error.is_cancelled() => return,
            Err(error) => Contact::Failure {
                at_ms,
                error: one_line(&error.to_string()),
            },
        };
        if let Err(error) = store.health_record(&self.server.name, contact).await {
            tracing::warn!(server = %self.server.name, %error, "could not record the server's liveness");
        }
    }

    /// Uses another clock for deadlines (tests use a manual one).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Names who acts, for audit rows.
    pub fn with_actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = actor.into();
        self
    }

    /// The server this client talks to.
    pub fn server(&self) -> &ServerConfig {
        &self.server
    }

    fn operation<'a>(
        &'a self,
        signal: Option<&'a dyn CancellationSignal>,
        correlation: Option<String>,
    ) -> Operation<'a> {
        Operation {
            deadline: Deadline::start(&*self.clock, self.server.timeout),
            signal,
            correlation,
            legs: Mutex::default(),
        }
    }

    fn next_id(&self) -> i64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Calls a tool: handshake if needed, then `tools/call`, all under one deadline and the
    /// caller's signal (seam 1 of 3). Never an error: failures are results (M12) that say
    /// how far the call got (V8). Every `tools/call` we stop waiting for after it may have
    /// reached the server is followed by a bounded `notifications/cancelled` (M4).
    pub async fn call_tool(
        &self,
        call: ToolCallRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> ToolCall {
        let op = self.operation(signal, call.correlation.clone());
        let mut request_id = None;
        let outcome = self.call_tool_legs(&op, &call, &mut request_id).await;
        self.record_contact(outcome.as_ref().map(|_| ())).await;
        // V8: a failure before the tools/call leg (handshake, gate, no tools) sent no call.
        let delivery = match (&outcome, request_id) {
            (Ok(_), _) => Delivery::Answered,
            (Err(error), Some(_)) => error.delivery(),
            (Err(_), None) => Delivery::NotSent,
        };
        if let (Err(error), Some(id), Delivery::MaybeDelivered) = (&outcome, request_id, delivery) {
            let reason = if error.is_cancelled() {
                "cancelled by the caller"
            } else {
                "the client stopped waiting for the result"
            };
            self.notify_cancelled(id, reason, call.correlation.clone())
                .await;
        }
        let result = match outcome {
            Ok(result) => ToolResult::from_wire(&result),
            Err(error) => ToolResult::from_error(error, delivery),
        };
        ToolCall {
            result,
            legs: op.legs(),
            request_id,
        }
    }

    async fn call_tool_legs(
        &self,
        op: &Operation<'_>,
        call: &ToolCallRequest,
        request_id: &mut Option<i64>,
    ) -> Result<Value, McpError> {
        let session = self.session(op).await?;
        self.require_tools(&session)?;
        let id = self.next_id();
        *request_id = Some(id);
        let params =
            CallToolRequestParams::new(call.tool.clone()).with_arguments(call.arguments.clone());
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        // R11: the gate runs inside the vault, after the audit intent and right before
        // the first byte of tools/call.
        let gate = call.gate.clone();
        match self
            .leg_gated(op, Some(&session), "tools/call", message, Some(id), gate)
            .await
        {
            Err(error @ McpError::SessionExpired { .. }) => {
                // M5: never silently re-send a tools/call; forget the session so the next
                // operation starts a fresh one.
                self.forget(&session).await;
                Err(error)
            }
            other => other.map(|a| a.message.unwrap_or(Value::Null)),
        }
    }

    /// Sends a request operation (seam 2 of 3): handshake if needed, then the request's
    /// legs (each `tools/list` page), all under one deadline and the caller's signal.
    pub async fn send_request(
        &self,
        request: Request,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Reply, McpError> {
        let op = self.operation(signal, None);
        let reply = match request {
            Request::ListTools => self.list_tools(&op).await.map(Reply::Tools),
            Request::Ping => self.ping(&op).await.map(|()| Reply::Pong),
        };
        self.record_contact(reply.as_ref().map(|_| ())).await;
        reply
    }

    async fn ping(&self, op: &Operation<'_>) -> Result<(), McpError> {
        let session = self.session(op).await?;
        let id = self.next_id();
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        self.leg(op, Some(&session), "ping", message, Some(id))
            .await
            .map(|_| ())
    }

    /// Sends a notification operation (seam 3 of 3), handshake included if needed.
    pub async fn send_notification(
        &self,
        notification: Notification,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<(), McpError> {
        let op = self.operation(signal, None);
        let sent = self.notify(&op, notification).await;
        self.record_contact(sent.as_ref().map(|_| ())).await;
        sent
    }

    async fn notify(&self, op: &Operation<'_>, notification: Notification) -> Result<(), McpError> {
        let session = self.session(op).await?;
        let (method, params) = match notification {
            Notification::Cancelled { request_id, reason } => (
                "notifications/cancelled",
                serde_json::to_value(CancelledNotificationParam::new(
                    Some(NumberOrString::Number(request_id)),
                    Some(reason),
                ))
                .unwrap_or(Value::Null),
            ),
        };
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.leg(op, Some(&session), method, message, None)
            .await
            .map(|_| ())
    }

    /// M4: tells the server a call we abandoned (cancelled, out of budget, a broken
    /// stream) is abandoned, so a cooperative server stops the work. Best effort: bounded,
    /// audited by the vault, never retried, no signal (the caller's may already be true and
    /// would stop it before send).
    async fn notify_cancelled(&self, request_id: i64, reason: &str, correlation: Option<String>) {
        let Some(session) = self.session.lock().await.clone() else {
            return;
        };
        let op = Operation {
            deadline: Deadline::start(&*self.clock, CANCEL_NOTICE_BUDGET),
            signal: None,
            correlation,
            legs: Mutex::default(),
        };
        let params = CancelledNotificationParam::new(
            Some(NumberOrString::Number(request_id)),
            Some(reason.into()),
        );
        let message =
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params});
        if let Err(error) = self
            .leg(
                &op,
                Some(&session),
                "notifications/cancelled",
                message,
                None,
            )
            .await
        {
            tracing::info!(server = %self.server.name, %error, "the cancellation notice did not reach the server");
        }
    }

    /// M6: walks the cursor; a 404 on a session re-initialises once (a read is safe to
    /// repeat).
    async fn list_tools(&self, op: &Operation<'_>) -> Result<Vec<ListedTool>, McpError> {
        let mut session = self.session(op).await?;
        self.require_tools(&session)?;
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut renewed = false;
        let mut pages = 0;
        loop {
            if pages == MAX_PAGES {
                return Err(McpError::TooManyPages {
                    server: self.server.name.clone(),
                    pages: MAX_PAGES,
                });
            }
            let id = self.next_id();
            let params = PaginatedRequestParams::default().with_cursor(cursor.clone());
            let message =
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params});
            let answer = match self
                .leg(op, Some(&session), "tools/list", message, Some(id))
                .await
            {
                Err(McpError::SessionExpired { .. }) if !renewed => {
                    renewed = true;
                    self.forget(&session).await;
                    session = self.session(op).await?;
                    continue;
                }
                other => other?,
            };
            pages += 1;
            let result = answer.message.unwrap_or(Value::Null);
            let page = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| self.malformed("tools/list", "the result has no tools list"))?;
            for tool in page {
                tools.push(self.listed_tool(tool)?);
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_string);
            if cursor.is_none() {
                return Ok(tools);
            }
        }
    }

    fn listed_tool(&self, tool: &Value) -> Result<ListedTool, McpError> {
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("tools/list", "a tool has no name"))?;
        Ok(ListedTool {
            name: name.to_string(),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            input_schema: tool.get("inputSchema").cloned().unwrap_or(Value::Null),
        })
    }

    fn require_tools(&self, session: &Session) -> Result<(), McpError> {
        if session.tools {
            Ok(())
        } else {
            Err(McpError::Protocol {
                server: self.server.name.clone(),
                problem: "the server does not offer tools".into(),
            })
        }
    }

    fn malformed(&self, method: &str, problem: &str) -> McpError {
        McpError::Malformed {
            server: self.server.name.clone(),
            method: method.into(),
            problem: problem.into(),
        }
    }

    /// The negotiated session, running the handshake under this operation if there is none.
    async fn session(&self, op: &Operation<'_>) -> Result<Arc<Session>, McpError> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref() {
            return Ok(session.clone());
        }
        let session = Arc::new(self.handshake(op).await?);
        *slot = Some(session.clone());
        Ok(session)
    }

    /// Drops the session if it is still the one that expired.
    async fn forget(&self, expired: &Arc<Session>) {
        let mut slot = self.session.lock().await;
        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, expired)) {
            *slot = None;
        }
    }

    /// M2: `initialize`, then `notifications/initialized`; both legs carry the signal.
    async fn handshake(&self, op: &Operation<'_>) -> Result<Session, McpError> {
        let id = self.next_id();
        let params = InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("runwarden", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25);
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params});
        let answer = self.leg(op, None, "initialize", message, Some(id)).await?;
        let result: InitializeResult =
            serde_json::from_value(answer.message.unwrap_or(Value::Null)).map_err(|e| {
                self.malformed(
                    "initialize",
                    &format!("not an initialize result ({})", one_line(&e.to_string())),
                )
            })?;
        let protocol = result.protocol_version.to_string();
        if !SUPPORTED_VERSIONS.contains(&protocol.as_str()) {
            return Err(McpError::Protocol {
                server: self.server.name.clone(),
                problem: format!(
                    "the server speaks protocol version {:?}; runwarden speaks {}",
                    one_line(&protocol),
                    SUPPORTED_VERSIONS.join(" and ")
                ),
            });
        }
        let session = Session {
            id: answer.response.header("mcp-session-id").map(str::to_string),
            protocol,
            tools: result.capabilities.tools.is_some(),
        };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.leg(
            op,
            Some(&session),
            "notifications/initialized",
            initialized,
            None,
        )
        .await?;
        Ok(session)
    }

    /// One POST through the vault (M1), bounded by what is left of the deadline (M3).
    async fn leg(
        &self,
        op: &Operation<'_>,
        session: Option<&Session>,
        method: &str,
        message: Value,
        id: Option<i64>,
    ) -> Result<Answer, McpError> {
        self.leg_gated(op, session, method, message, id, None).await
    }

    /// [`leg`](Self::leg) with the caller's gate run right before the transfer.
    async fn leg_gated(
        &self,
        op: &Operation<'_>,
        session: Option<&Session>,
        method: &str,
        message: Value,
        id: Option<i64>,
        gate: Option<CallGate>,
    ) -> Result<Answer, McpError> {
        let server = &self.server.name;
        let Some(granted) = op.deadline.grant() else {
            return Err(McpError::NotSent {
                server: server.clone(),
                method: method.into(),
                budget: op.deadline.budget(),
            });
        };
        let body = serde_json::to_vec(&message).expect("JSON values always serialize");
        let mut request = EgressRequest::new(Method::Post, self.server.url.clone())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .timeout(granted)
            .max_response_bytes(MAX_RESPONSE_BYTES)
            .actor(self.actor.clone())
            .reason(format!("mcp {server} {method}"));
        let sent_session_id = session.and_then(|s| s.id.as_deref());
        if let Some(session) = session {
            if let Some(session_id) = &session.id {
                request = request.header("mcp-session-id", session_id.clone());
            }
            request = request.header("mcp-protocol-version", session.protocol.clone());
        }
        if let Some(auth) = &self.server.auth {
            request = request.credential(auth.clone());
        }
        if let Some(correlation) = &op.correlation {
            request = request.correlation(correlation.clone());
        }
        if let Some(gate) = gate {
            request = request.before_transfer(Box::new(move || (gate.0)()));
        }
        let intent = Arc::new(AtomicI64::new(0));
        let seen = intent.clone();
        request = request.on_intent(Box::new(move |id| seen.store(id, Ordering::Relaxed)));
        if let Some(id) = id {
            // An event stream may stay open after our answer: stop reading once it is in.
            request = request.complete_when(Box::new(move |body: &[u8]| {
                std::str::from_utf8(body)
                    .is_ok_and(|text| sse::find_response(text, id, false).is_some())
            }));
        }
        let started = Instant::now();
        let sent = self.egress.send(request, op.signal).await;
        let report = LegReport {
            method: method.into(),
            granted,
            elapsed: started.elapsed(),
            answered: sent.is_ok(),
            audit_id: Some(intent.load(Ordering::Relaxed)).filter(|id| *id > 0),
        };
        op.legs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(report);
        let response = sent.map_err(|e| self.egress_error(method, e))?;
        self.interpret(method, response, id, sent_session_id.is_some())
    }

    fn egress_error(&self, method: &str, error: EgressError) -> McpError {
        let (server, method) = (self.server.name.clone(), method.to_string());
        match error {
            EgressError::CancelledBeforeSend => McpError::Cancelled {
                server,
                method,
                in_flight: false,
            },
            EgressError::CancelledInFlight { .. } => McpError::Cancelled {
                server,
                method,
                in_flight: true,
            },
            EgressError::Held { reason } => McpError::Gated { server, reason },
            EgressError::Redirect { status, .. } => McpError::Status {
                server,
                method,
                status,
            },
            source => McpError::Egress {
                server,
                method,
                source: Box::new(source),
            },
        }
    }

    /// M5: turns an HTTP answer into the JSON-RPC result, or a typed failure.
    fn interpret(
        &self,
        method: &str,
        response: EgressResponse,
        id: Option<i64>,
        sent_session_id: bool,
    ) -> Result<Answer, McpError> {
        let (server, method_s) = (self.server.name.clone(), method.to_string());
        if response.status == 404 && sent_session_id {
            return Err(McpError::SessionExpired {
                server,
                method: method_s,
            });
        }
        if !response.is_success() {
            return Err(McpError::Status {
                server,
                method: method_s,
                status: response.status,
            });
        }
        if response.truncated {
            return Err(McpError::TooLarge {
                server,
                method: method_s,
                limit: MAX_RESPONSE_BYTES,
            });
        }
        let Some(id) = id else {
            // M1: a notification is accepted with 202 (any 2xx is tolerated).
            return Ok(Answer {
                message: None,
                response,
            });
        };
        if response.body.iter().all(u8::is_ascii_whitespace) {
            return Err(McpError::EmptyBody {
                server,
                method: method_s,
            });
        }
        let content_type = response
            .header("content-type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let message = match content_type.as_str() {
            "application/json" => {
                let message: Value = serde_json::from_slice(&response.body)
                    .map_err(|_| self.malformed(method, "the body is not JSON"))?;
                if !sse::is_response_to(&message, id) {
                    return Err(self.malformed(method, "the body is not a response to our request (neither result nor error for its id)"));
                }
                message
            }
            "text/event-stream" => {
                let text = String::from_utf8_lossy(&response.body);
                sse::find_response(&text, id, true).ok_or(McpError::NoResponse {
                    server: server.clone(),
                    method: method_s.clone(),
                })?
            }
            "text/html" => {
                return Err(McpError::Html {
                    server,
                    method: method_s,
                });
            }
            other => {
                return Err(McpError::ContentType {
                    server,
                    method: method_s,
                    content_type: other.chars().take(60).collect(),
                });
            }
        };
        if let Some(error) = message.get("error") {
            return Err(McpError::Rpc {
                server,
                method: method_s,
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: one_line(error.get("message").and_then(Value::as_str).unwrap_or("")),
            });
        }
        Ok(Answer {
            message: message.get("result").cloned(),
            response,
        })
    }
}
