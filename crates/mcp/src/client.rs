//! The MCP client: the connection (a 2026-07-28 stateless one after `server/discover`, M19,
//! or the handshake and its session, M13), the three places a signal enters,
//! every leg sent through the vault's guarded egress client, the server's own requests
//! answered while a stream is open (M14), progress handed on (M15) and broken streams
//! resumed (M16).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CancelledNotificationParam, ClientCapabilities, Implementation,
    InitializeRequestParams, InitializeResult, NumberOrString, PaginatedRequestParams,
    ProtocolVersion,
};
use runwarden_oauth::{AuthorizationPrompt, OAuthClient, OAuthError};
use runwarden_vault::{
    CancellationSignal, Credential, Delivery, EgressClient, EgressError, EgressRequest,
    EgressResponse, Method,
};
use serde_json::{Map, Value, json};

use crate::catalogue::{CatalogueStore, Contact};
use crate::config::{ElicitationPolicy, PROGRESS_HARD_MAX, ProtocolPolicy, ServerConfig};
use crate::deadline::{Clock, Deadline, MIN_LEG, SystemClock};

use crate::elicit::{ElicitationAnswer, ElicitationRequest};
use crate::error::{McpError, one_line};
use crate::result::ToolResult;
use crate::sse;
use crate::stateless::{
    self, HeaderParam, HeaderRefusal, InputRequired, InputResume, MAX_INPUT_ROUNDS,
    STATELESS_VERSION,
};
use crate::stream::{Marks, NoticeSink, OnProgress, ServerRequest, Watch};

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The protocol versions this client accepts, newest first (M17, M19): the stateless
/// 2026-07-28 through `server/discover`, the others through the `initialize` handshake,
/// which offers the second.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"];

/// The versions the `initialize` handshake accepts (M17).
const HANDSHAKE_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// The version of the old HTTP+SSE transport, refused with a message that says so (M17).
const OLD_HTTP_SSE_VERSION: &str = "2024-11-05";

/// `User-Agent` on every request (M17).
pub const USER_AGENT: &str = concat!("runwarden/", env!("CARGO_PKG_VERSION"));

/// The bound of the `DELETE` that ends a session when the client shuts down (M13).
pub const CLOSE_BUDGET: Duration = Duration::from_secs(2);

/// The most reconnections one request's stream gets (M16).
pub const MAX_RESUMES: usize = 3;

/// The longest the client waits before a reconnection, whatever `retry` the server asked.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// M14: the longest a `tools/call` waits for its standalone GET stream to open, so that a
/// question the server sends on it at once is not lost.
const STANDALONE_OPEN_WAIT: Duration = Duration::from_secs(1);

/// The wait before a reconnection when the server gave no `retry`.
const DEFAULT_RETRY_WAIT: Duration = Duration::from_millis(500);

/// M14: the code of the error that refuses a request whose capability is not declared.
const METHOD_NOT_FOUND: i64 = -32601;

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
    /// M11, M19: the probe that fits the server's version: `server/discover` at 2026-07-28
    /// (stateless servers have no `ping`), `ping` at older versions, with `tools/list`
    /// when the server does not answer `ping`.
    Health,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Reply {
    /// Every tool the server listed, in order.
    Tools(Vec<ListedTool>),
    /// The server answered the ping.
    Pong,
    /// The server answered the health probe.
    Alive {
        /// The protocol version spoken.
        protocol: String,
        /// The method that proved it alive (`server/discover`, `ping` or `tools/list`).
        probe: String,
    },
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListedTool {
    /// The remote name.
    pub name: String,
    /// The server's description, if any.
    pub description: Option<String>,
    /// The input schema as sent.
    pub input_schema: Value,
    /// The output schema as sent, if the tool declared one (M7 amended).
    pub output_schema: Option<Value>,
    /// `execution.taskSupport` as sent (`"required"`, `"optional"`, `"forbidden"`).
    pub task_support: Option<String>,
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
    /// The `outputSchema` the tool declared at import (M7 amended): a success whose
    /// `structuredContent` does not match it is a failed tool result.
    pub output_schema: Option<Value>,
    /// Gets the call's progress and log notifications as they arrive (M15).
    pub notices: Option<NoticeSink>,
    /// M19: with `true`, a result that asks for input (`input_required`) comes back as
    /// [`ToolCall::input_required`] for the caller to ask someone and re-issue later (a
    /// run parks); with `false`, the client answers it at once through `elicitor` (or
    /// declines) and re-issues the request within the same budget.
    pub park_on_input: bool,
    /// M19: the answers to an earlier `input_required` result of this same call, sent
    /// with the request (`inputResponses`, and the server's `requestState` unchanged).
    pub resume: Option<InputResume>,
    /// The operator sends the call although the imported catalogue does not offer the
    /// tool (`mcp call --force`); the audit rows of its legs say it was forced.
    pub forced: bool,
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
    /// M19: the server asked for input and the call was made with `park_on_input`; the
    /// result then says so and nothing of the tool's work was done.
    pub input_required: Option<InputRequired>,
    /// The protocol version spoken, once a session was ready.
    pub protocol: Option<String>,
}

/// How one [`McpClient::send_request`] went ([`McpClient::last_request`]).
#[derive(Debug, Clone)]
pub struct RequestTrail {
    /// The protocol version spoken, once a session was ready.
    pub protocol: Option<String>,
    /// Every leg of the operation, in order.
    pub legs: Vec<LegReport>,
    /// `(protocol X; tried A, B)`: what a failure's text adds so it names the version
    /// and the legs tried.
    pub trail: String,
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
    /// M19: a 2026-07-28 connection: no session, `_meta` on every request, cancellation by
    /// closing the stream and no notifications.
    stateless: bool,
    /// M19: taken from what the store remembered, not probed by this process.
    remembered: bool,
    /// The run tag of the operation that opened the session, for its `DELETE`'s audit row.
    pub(crate) correlation: Option<String>,
    /// The server answered a standalone GET with 405: it offers no standalone stream for
    /// this session, so none is asked for again.
    no_standalone: AtomicBool,
}

/// One operation: its deadline, the caller's signal and the legs so far.
struct Operation<'a> {
    deadline: Deadline<'a>,
    signal: Option<&'a dyn CancellationSignal>,
    correlation: Option<String>,
    legs: Mutex<Vec<LegReport>>,
    /// The protocol version of the session it used, once there was one.
    protocol: Mutex<Option<String>>,
    /// The operator forced the call past the catalogue; its audit rows say so.
    forced: bool,
}

impl Operation<'_> {
    fn legs(self) -> Vec<LegReport> {
        self.legs.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// The protocol version the operation spoke, once a session was ready.
    fn protocol(&self) -> Option<String> {
        self.protocol
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True when a leg of `method` went out and was answered in this operation.
    fn answered(&self, method: &str) -> bool {
        self.legs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.method == method && l.answered)
    }

    /// What an error of this operation adds so it names the protocol version and what
    /// was tried: `(protocol 2025-11-25; tried server/discover, initialize, tools/call)`.
    fn trail(&self) -> String {
        let legs = self.legs.lock().unwrap_or_else(|p| p.into_inner());
        let mut tried: Vec<&str> = Vec::new();
        for leg in legs.iter() {
            if tried.last() != Some(&leg.method.as_str()) {
                tried.push(&leg.method);
            }
        }
        let protocol = self.protocol().unwrap_or_else(|| "not negotiated".into());
        let tried = if tried.is_empty() {
            "nothing was sent".to_string()
        } else {
            format!("tried {}", tried.join(", "))
        };
        format!("(protocol {protocol}; {tried})")
    }

    /// True when the caller's own signal says stop (not the deadline's).
    fn caller_cancelled(&self) -> bool {
        self.signal.is_some_and(|s| s.is_cancelled())
    }
}

/// M15: the caller's signal, plus the soft end of a deadline that progress stretches. The
/// vault sends a stretchable leg bounded by the hard maximum and stops it through this
/// signal when the (moving) soft end passes.
struct Stretch<'a> {
    caller: Option<&'a dyn CancellationSignal>,
    deadline: &'a Deadline<'a>,
}

impl CancellationSignal for Stretch<'_> {
    fn is_cancelled(&self) -> bool {
        self.caller.is_some_and(|s| s.is_cancelled()) || self.deadline.remaining().is_zero()
    }

    fn woken(&self) -> runwarden_vault::WakeFuture<'_> {
        Box::pin(async move {
            let caller = async {
                match self.caller {
                    Some(signal) => until_cancelled(signal).await,
                    None => std::future::pending().await,
                }
            };
            let end = async {
                // The end moves with progress: sleep to it, look again.
                loop {
                    let left = self.deadline.remaining();
                    if left.is_zero() {
                        return;
                    }
                    tokio::time::sleep(left).await;
                }
            };
            tokio::select! {
                () = caller => {}
                () = end => {}
            }
        })
    }

    fn wakes(&self) -> bool {
        true
    }
}

/// What one leg sends, beyond its operation.
struct LegSpec<'s> {
    http: Method,
    /// The JSON-RPC method (or what the leg is for), for reports, audit and errors.
    method: &'s str,
    /// The session whose headers the leg carries (none for `initialize`).
    session: Option<&'s Session>,
    /// The POST body.
    message: Option<Value>,
    /// Our request id, when a response is due.
    id: Option<i64>,
    gate: Option<CallGate>,
    /// M16: a GET that resumes a stream after this event.
    last_event_id: Option<String>,
    /// How the leg answers what the server sends in its stream.
    listen: Option<&'s Listen<'s>>,
    /// M14: the leg is the standalone GET stream of a call.
    standalone: Option<Standalone>,
    /// M19: the call's mirrored `Mcp-Param-*` headers.
    headers: Vec<(String, String)>,
}

/// M14: what the standalone GET stream of one `tools/call` needs: the call it serves, the
/// flag that ends it with the call, and who waits for it to open.
struct Standalone {
    call_id: i64,
    ended: tokio::sync::watch::Receiver<bool>,
    opened: Option<tokio::sync::oneshot::Sender<u16>>,
}

/// Stops a call's standalone GET stream once the call ended, or when the call's own
/// signal (or its deadline) says stop.
struct UntilEnded<'a> {
    inner: Option<&'a dyn CancellationSignal>,
    ended: tokio::sync::watch::Receiver<bool>,
}

impl CancellationSignal for UntilEnded<'_> {
    fn is_cancelled(&self) -> bool {
        *self.ended.borrow() || self.inner.is_some_and(|s| s.is_cancelled())
    }

    fn woken(&self) -> runwarden_vault::WakeFuture<'_> {
        Box::pin(async move {
            let mut ended = self.ended.clone();
            let inner = async {
                match self.inner {
                    Some(signal) => until_cancelled(signal).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = until_done(&mut ended) => {}
                () = inner => {}
            }
        })
    }

    fn wakes(&self) -> bool {
        true
    }
}

impl<'s> LegSpec<'s> {
    fn post(method: &'s str, message: Value, id: Option<i64>) -> Self {
        Self {
            http: Method::Post,
            method,
            session: None,
            message: Some(message),
            id,
            gate: None,
            last_event_id: None,
            listen: None,
            standalone: None,
            headers: Vec::new(),
        }
    }
}

/// M14/M15: what a request's legs need to answer the server's own requests and to hand
/// over its notices while the stream is open.
struct Listen<'l> {
    session: &'l Session,
    tool: Option<&'l str>,
    elicitor: Option<&'l crate::ElicitorHandle>,
    notices: Option<NoticeSink>,
    marks: Arc<Mutex<Marks>>,
    on_progress: Option<OnProgress>,
}

impl<'l> Listen<'l> {
    fn plain(session: &'l Session) -> Self {
        Self {
            session,
            tool: None,
            elicitor: None,
            notices: None,
            marks: Arc::default(),
            on_progress: None,
        }
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
    /// M19: each listed tool's `x-mcp-header` parameters (or why they are refused), by
    /// remote name, learnt from `tools/list`.
    header_params:
        Mutex<std::collections::HashMap<String, Result<Vec<HeaderParam>, HeaderRefusal>>>,
    /// M18: the server's OAuth client, when it is configured for OAuth.
    oauth: Option<Arc<OAuthClient>>,
    /// How the last request operation went.
    last: Mutex<Option<RequestTrail>>,
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
        let oauth = server.oauth.clone().and_then(|settings| {
            match OAuthClient::new(egress.clone(), server.name.clone(), &server.url, settings) {
                Ok(client) => Some(Arc::new(client)),
                Err(error) => {
                    // The configuration checks the URL at load; this only logs a caller
                    // that skipped it, whose requests then go without a token.
                    tracing::warn!(server = %server.name, %error, "OAuth is configured but cannot start");
                    None
                }
            }
        });
        Self {
            oauth,
            server,
            egress,
            clock: Arc::new(SystemClock::default()),
            session: tokio::sync::Mutex::new(None),
            next_id: AtomicI64::new(1),
            actor: "mcp".into(),
            health: None,
            header_params: Mutex::default(),
            last: Mutex::default(),
        }
    }

    /// M18: lets an authorization code grant ask the operator (the CLI prints the URL and
    /// waits on the loopback redirect). Without it, a grant that needs a login fails with
    /// a typed error that says to run `runwarden mcp login`.
    pub fn with_authorization_prompt(mut self, prompt: Arc<dyn AuthorizationPrompt>) -> Self {
        if let Some(settings) = self.server.oauth.clone()
            && let Ok(client) = OAuthClient::new(
                self.egress.clone(),
                self.server.name.clone(),
                &self.server.url,
                settings,
            )
        {
            self.oauth = Some(Arc::new(client.with_prompt(prompt)));
        }
        self
    }

    /// M18: the server's OAuth client, when it is configured for OAuth.
    pub fn oauth(&self) -> Option<&Arc<OAuthClient>> {
        self.oauth.as_ref()
    }

    /// Records each operation's outcome as the server's liveness (M11).
    pub fn with_health(mut self, store: Arc<dyn CatalogueStore>) -> Self {
        self.health = Some(store);
        self
    }

    /// M19: what the store remembers this server speaks, when fresh.
    async fn known_protocol(&self) -> Option<crate::KnownProtocol> {
        let store = self.health.as_ref()?;
        crate::known::recall(store, &self.server, now_ms()).await
    }

    /// M19: remembers what a handshake or a probe found, for the next process.
    async fn remember(&self, session: &Session, ttl: Duration) {
        if let Some(store) = &self.health {
            let (protocol, tools) = (&session.protocol, session.tools);
            crate::known::remember(store, &self.server, protocol, tools, ttl, now_ms()).await;
        }
    }

    /// M11: a success or a failure per operation; a cancellation is neither, because it
    /// says nothing about the server. M19: a failure that may mean the server changed
    /// forgets what it was remembered to speak (and a remembered stateless connection),
    /// so the next operation probes again.
    async fn record_contact(&self, op: &Operation<'_>, outcome: Result<(), &McpError>) {
        if let Err(error) = outcome
            && crate::known::may_have_changed(error)
        {
            let mut slot = self.session.lock().await;
            if slot.as_ref().is_some_and(|s| s.remembered && s.stateless) {
                *slot = None;
            }
            drop(slot);
            if let Some(store) = &self.health {
                crate::known::forget(store, &self.server).await;
            }
        }
        let Some(store) = &self.health else { return };
        let at_ms = now_ms();
        let contact = match outcome {
            Ok(()) => Contact::Success { at_ms },
            Err(error) if error.is_cancelled() => return,
            Err(error) => {
                // Shown in `mcp list`, the API and the console: checked for every stored
                // secret once more (the vault scrubbed what the server sent; this covers
                // text assembled from several answers).
                let text = one_line(&format!("{error} {}", op.trail()));
                let text = match self.egress.redactor().await {
                    Ok(redactor) => redactor.text(&text).into_owned(),
                    Err(_) => text,
                };
                Contact::Failure { at_ms, error: text }
            }
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
            protocol: Mutex::default(),
            forced: false,
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
        let mut op = self.operation(signal, call.correlation.clone());
        op.forced = call.forced;
        if self.server.progress_extends_deadline {
            op.deadline =
                Deadline::stretchable(&*self.clock, self.server.timeout, PROGRESS_HARD_MAX);
        }
        let mut request_id = None;
        let mut input_required = None;
        let outcome = self
            .call_tool_legs(&op, &call, &mut request_id, &mut input_required)
            .await;
        self.record_contact(&op, outcome.as_ref().map(|_| ())).await;
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
            // M19: nothing of the tool's work was done; the caller asks and re-issues.
            Ok(_) if input_required.is_some() => ToolResult::from_wire(
                &json!({"content": [{"type": "text", "text": "the server asks for input before it runs this tool"}], "isError": true}),
                None,
            ),
            Ok(result) => ToolResult::from_wire(&result, call.output_schema.as_ref()),
            Err(error) => {
                let mut result = ToolResult::from_error(error, delivery);
                result.text = format!("{} {}", result.text, op.trail());
                result
            }
        };
        let protocol = op.protocol();
        ToolCall {
            result,
            legs: op.legs(),
            request_id,
            input_required,
            protocol,
        }
    }

    async fn call_tool_legs(
        &self,
        op: &Operation<'_>,
        call: &ToolCallRequest,
        request_id: &mut Option<i64>,
        input_required: &mut Option<InputRequired>,
    ) -> Result<Value, McpError> {
        let session = self.session(op).await?;
        self.require_tools(&session)?;
        let headers = if session.stateless {
            self.param_headers(op, call).await?
        } else {
            Vec::new()
        };
        let mut resume = call.resume.clone();
        let mut rounds = 0;
        loop {
            let result = self
                .call_once(op, &session, call, &headers, resume.as_ref(), request_id)
                .await?;
            // M19: a result without `resultType` is complete.
            let Some(asked) = InputRequired::from_result(&result) else {
                return Ok(result);
            };
            // A question only an operator can answer parks the caller; one the policy
            // declines (or one the client refuses) is answered here and now.
            let elicits = |r: &crate::stateless::InputRequest| r.method == "elicitation/create";
            if call.park_on_input
                && self.server.elicitation == ElicitationPolicy::Operator
                && asked.requests.iter().all(elicits)
            {
                if asked.requests.len() != 1 {
                    return Err(McpError::InputRefused {
                        server: self.server.name.clone(),
                        tool: call.tool.clone(),
                        problem: format!(
                            "the server asked {} questions at once; a parked run answers one per round",
                            asked.requests.len()
                        ),
                    });
                }
                *input_required = Some(asked);
                return Ok(result);
            }
            rounds += 1;
            if rounds > MAX_INPUT_ROUNDS {
                return Err(McpError::InputRefused {
                    server: self.server.name.clone(),
                    tool: call.tool.clone(),
                    problem: format!(
                        "the server still asked for input after {MAX_INPUT_ROUNDS} rounds"
                    ),
                });
            }
            resume = Some(self.answer_inputs(op, &session, call, &asked).await?);
        }
    }

    /// M19: answers the questions of an `input_required` result at once: an elicitation
    /// through the call's elicitor (declined without one), anything else is refused.
    async fn answer_inputs(
        &self,
        op: &Operation<'_>,
        session: &Session,
        call: &ToolCallRequest,
        asked: &InputRequired,
    ) -> Result<InputResume, McpError> {
        let listen = Listen {
            tool: Some(&call.tool),
            elicitor: call.elicitor.as_ref(),
            ..Listen::plain(session)
        };
        let mut responses = Map::new();
        for request in &asked.requests {
            if request.method != "elicitation/create" {
                return Err(McpError::InputRefused {
                    server: self.server.name.clone(),
                    tool: call.tool.clone(),
                    problem: format!(
                        "the server asked for {:?} as input, which runwarden does not offer",
                        one_line(&request.method)
                    ),
                });
            }
            let answer = self.elicit(op, &listen, &request.params).await;
            responses.insert(request.key.clone(), answer);
        }
        Ok(InputResume {
            responses,
            request_state: asked.request_state.clone(),
        })
    }

    /// M19: the call's `Mcp-Param-*` headers. The tool's `x-mcp-header` parameters are
    /// learnt from `tools/list` (listed in this operation when this client has not seen
    /// the tool yet); a tool whose declarations break the rules, or an argument that
    /// cannot be a header, refuses the call before anything is sent.
    async fn param_headers(
        &self,
        op: &Operation<'_>,
        call: &ToolCallRequest,
    ) -> Result<Vec<(String, String)>, McpError> {
        let known = |client: &Self| {
            client
                .header_params
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&call.tool)
                .cloned()
        };
        let params = match known(self) {
            Some(params) => Some(params),
            None => {
                self.list_tools(op).await?;
                known(self)
            }
        };
        let params = match params {
            // A tool the server does not list has nothing to mirror.
            None => return Ok(Vec::new()),
            Some(Err(refusal)) => {
                return Err(McpError::ToolHeaders {
                    server: self.server.name.clone(),
                    tool: call.tool.clone(),
                    problem: refusal.to_string(),
                });
            }
            Some(Ok(params)) => params,
        };
        stateless::mirrored_headers(&params, &call.arguments).map_err(|e| McpError::HeaderValue {
            server: self.server.name.clone(),
            tool: call.tool.clone(),
            problem: e.to_string(),
        })
    }

    /// One `tools/call` request (with a resumed one's answers), its stream listened to.
    async fn call_once(
        &self,
        op: &Operation<'_>,
        session: &Arc<Session>,
        call: &ToolCallRequest,
        headers: &[(String, String)],
        resume: Option<&InputResume>,
        request_id: &mut Option<i64>,
    ) -> Result<Value, McpError> {
        let session = session.clone();
        let id = self.next_id();
        *request_id = Some(id);
        let params =
            CallToolRequestParams::new(call.tool.clone()).with_arguments(call.arguments.clone());
        let mut params = serde_json::to_value(params).unwrap_or_else(|_| json!({}));
        // M15: our request id is the progress token, so progress is matched to its call.
        params["_meta"] = json!({"progressToken": id});
        // O5: the trace, as the MCP spec's `_meta.traceparent` too (the header carries it
        // on every leg); only when this process exports traces.
        if let Some(traceparent) = runwarden_vault::trace::traceparent() {
            params["_meta"]["traceparent"] = json!(traceparent);
        }
        if let Some(resume) = resume {
            resume.apply(&mut params);
        }
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let on_progress: Option<OnProgress> = op.deadline.stretches().then(|| {
            let (cell, clock) = (op.deadline.progress_cell(), self.clock.clone());
            Arc::new(move || {
                *cell.lock().unwrap_or_else(|p| p.into_inner()) = Some(clock.now());
            }) as OnProgress
        });
        let listen = Listen {
            session: &session,
            tool: Some(&call.tool),
            elicitor: call.elicitor.as_ref(),
            notices: call.notices.clone(),
            marks: Arc::default(),
            on_progress,
        };
        // R11: the gate runs inside the vault, after the audit intent and right before
        // the first byte of tools/call.
        let spec = LegSpec {
            session: Some(&session),
            gate: call.gate.clone(),
            listen: Some(&listen),
            headers: headers.to_vec(),
            ..LegSpec::post("tools/call", message, Some(id))
        };
        let answered = if session.id.is_some() && !session.no_standalone.load(Ordering::Relaxed) {
            // M14: a stateful server may ask its questions on the standalone GET stream,
            // so one is open for the call's lifetime, and the call waits (briefly) for it
            // to open so a question sent at once is not lost. A server that refused one
            // (405) for this session is not asked again.
            let (end, ended) = tokio::sync::watch::channel(false);
            let (opened_tx, opened) = tokio::sync::oneshot::channel();
            let stream = Standalone {
                call_id: id,
                ended,
                opened: Some(opened_tx),
            };
            let post = async {
                let wait = STANDALONE_OPEN_WAIT.min(op.deadline.remaining() / 4);
                let _ = tokio::time::timeout(wait, opened).await;
                let answered = self.resumable(op, spec).await;
                let _ = end.send(true);
                answered
            };
            let (answered, ()) = tokio::join!(post, self.standalone(op, &listen, stream));
            answered
        } else {
            self.resumable(op, spec).await
        };
        if let Err(McpError::SessionExpired { .. }) = &answered {
            // M5: never silently re-send a tools/call; forget the session so the next
            // operation starts a fresh one.
            self.forget(&session).await;
        }
        answered.map(|a| a.message.unwrap_or(Value::Null))
    }

    /// M14: the standalone GET stream of one call, open until the call ends (or its
    /// budget or signal does), through the vault like every leg. The server's requests in
    /// it are answered as a response stream's are. A server that offers none (405), or
    /// already has one open for the session (409), simply gets none; no failure of this
    /// stream touches the call. A 405, or an answer that is not an event stream, is
    /// remembered for the session: its later calls ask for no standalone stream.
    async fn standalone(&self, op: &Operation<'_>, listen: &Listen<'_>, stream: Standalone) {
        let spec = LegSpec {
            http: Method::Get,
            method: "standalone stream",
            session: Some(listen.session),
            message: None,
            id: None,
            gate: None,
            last_event_id: None,
            listen: Some(listen),
            standalone: Some(stream),
            headers: Vec::new(),
        };
        let refused = match Box::pin(self.leg_spec(op, spec)).await {
            // A stream is `text/event-stream`; any other answer opens none.
            Ok(answer) => !answer.response.header("content-type").is_some_and(|t| {
                t.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            }),
            Err(
                McpError::Status { status: 405, .. }
                | McpError::Rpc {
                    status: Some(405), ..
                },
            ) => true,
            Err(error) => {
                tracing::debug!(server = %self.server.name, %error, "the standalone stream is closed");
                false
            }
        };
        if refused {
            tracing::debug!(server = %self.server.name, "the server offers no standalone stream for this session");
            listen.session.no_standalone.store(true, Ordering::Relaxed);
        }
    }

    /// M16: sends a request whose answer may come in an event stream; when the stream
    /// ends before the answer and the server gave event ids, reconnects with GET and
    /// `Last-Event-ID` after the server's `retry`, at most [`MAX_RESUMES`] times, within
    /// the operation's budget and under its signal. The request is never sent again.
    async fn resumable(&self, op: &Operation<'_>, spec: LegSpec<'_>) -> Result<Answer, McpError> {
        let (method, id, listen) = (spec.method, spec.id, spec.listen);
        let mut answered = self.leg_spec(op, spec).await;
        let mut attempts = 0;
        loop {
            let error = match answered {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            if error.is_cancelled() || !Self::stream_broke(&error) {
                return Err(self.after_resumes(method, attempts, error));
            }
            let Some(listen) = listen else {
                return Err(error);
            };
            let (last_event_id, retry) = {
                let marks = listen.marks.lock().unwrap_or_else(|p| p.into_inner());
                (marks.last_event_id.clone(), marks.retry)
            };
            let Some(last_event_id) = last_event_id else {
                // Nothing to resume from: the error says maybe_delivered (V8).
                return Err(self.after_resumes(method, attempts, error));
            };
            if attempts == MAX_RESUMES {
                return Err(self.after_resumes(method, attempts, error));
            }
            let wait = retry.unwrap_or(DEFAULT_RETRY_WAIT).min(MAX_RETRY_WAIT);
            if op.deadline.remaining() < wait + op.deadline.floor() {
                let cause = McpError::NotSent {
                    server: self.server.name.clone(),
                    method: method.into(),
                    budget: op.deadline.budget(),
                };
                return Err(self.after_resumes(method, attempts.max(1), cause));
            }
            if self.pause(op, wait).await {
                return Err(McpError::Cancelled {
                    server: self.server.name.clone(),
                    method: method.into(),
                    in_flight: true,
                });
            }
            attempts += 1;
            tracing::debug!(server = %self.server.name, method, attempts, "resuming the response stream");
            answered = self
                .leg_spec(
                    op,
                    LegSpec {
                        http: Method::Get,
                        method,
                        session: Some(listen.session),
                        message: None,
                        id,
                        gate: None,
                        last_event_id: Some(last_event_id),
                        listen: Some(listen),
                        standalone: None,
                        headers: Vec::new(),
                    },
                )
                .await;
        }
    }

    /// A failure after resumption began is `ResumeFailed` (maybe delivered, V8), unless it
    /// is the caller's cancel.
    fn after_resumes(&self, method: &str, attempts: usize, error: McpError) -> McpError {
        if attempts == 0 || error.is_cancelled() {
            return error;
        }
        McpError::ResumeFailed {
            server: self.server.name.clone(),
            method: method.into(),
            attempts,
            cause: one_line(&error.to_string()),
        }
    }

    /// M16: the stream ended (or broke) before our response.
    fn stream_broke(error: &McpError) -> bool {
        match error {
            McpError::NoResponse { .. } => true,
            McpError::Egress { source, .. } => matches!(**source, EgressError::Transport { .. }),
            _ => false,
        }
    }

    /// Waits `wait` before a reconnection; true when the caller cancelled meanwhile.
    async fn pause(&self, op: &Operation<'_>, wait: Duration) -> bool {
        match op.signal {
            Some(signal) => {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = until_cancelled(signal) => {}
                }
            }
            None => tokio::time::sleep(wait).await,
        }
        op.caller_cancelled()
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
            Request::Health => self.probe(&op).await,
        };
        self.record_contact(&op, reply.as_ref().map(|_| ())).await;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(RequestTrail {
            protocol: op.protocol(),
            trail: op.trail(),
            legs: op.legs(),
        });
        reply
    }

    /// How the last [`send_request`](Self::send_request) of this client went (the
    /// protocol, the legs), for a caller that runs one operation at a time and reports
    /// it, as the CLI does. Concurrent callers must not rely on it.
    pub fn last_request(&self) -> Option<RequestTrail> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// M11, M19: the health probe that fits the version. At 2026-07-28 the `server/discover`
    /// of this operation's handshake is the probe when it ran, else one is sent; at older
    /// versions `ping`, and `tools/list` when the server does not implement `ping`.
    async fn probe(&self, op: &Operation<'_>) -> Result<Reply, McpError> {
        let session = self.session(op).await?;
        let alive = |probe: &str| Reply::Alive {
            protocol: session.protocol.clone(),
            probe: probe.into(),
        };
        if session.stateless {
            if op.answered("server/discover") {
                return Ok(alive("server/discover"));
            }
            return match self.discover(op).await? {
                Some(_) => Ok(alive("server/discover")),
                None => Err(McpError::Protocol {
                    server: self.server.name.clone(),
                    problem: format!(
                        "the server no longer serves {STATELESS_VERSION} (its server/discover answer does not name it); the next operation negotiates again"
                    ),
                }),
            };
        }
        match self.ping(op).await {
            Ok(()) => Ok(alive("ping")),
            Err(
                McpError::Rpc {
                    code: METHOD_NOT_FOUND,
                    ..
                }
                | McpError::Status {
                    status: 404 | 405, ..
                },
            ) => {
                self.list_tools(op).await?;
                Ok(alive("tools/list"))
            }
            Err(error) => Err(error),
        }
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
        self.record_contact(&op, sent.as_ref().map(|_| ())).await;
        sent
    }

    async fn notify(&self, op: &Operation<'_>, notification: Notification) -> Result<(), McpError> {
        let session = self.session(op).await?;
        if session.stateless {
            // M19: a 2026-07-28 server takes no notifications from a client; a request
            // is cancelled by closing its response stream.
            return Err(McpError::Protocol {
                server: self.server.name.clone(),
                problem: "the server speaks 2026-07-28, which has no client notifications: a request is cancelled by closing its stream".into(),
            });
        }
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
        if session.stateless {
            // M4 (amended), M19: a 2026-07-28 server learns of the cancel from the closed
            // response stream (the vault's teardown closed it); no notification exists.
            tracing::debug!(server = %self.server.name, request_id, "call abandoned; its stream was closed");
            return;
        }
        let op = Operation {
            deadline: Deadline::start(&*self.clock, CANCEL_NOTICE_BUDGET),
            signal: None,
            correlation,
            legs: Mutex::default(),
            protocol: Mutex::default(),
            forced: false,
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
            let mut result = answer.message.unwrap_or(Value::Null);
            // The catalogue keeps descriptions and schemas and sends them to model
            // providers: each string is checked for every stored secret once more, as
            // decoded, before anything is kept.
            self.egress
                .redactor()
                .await
                .map_err(|e| self.egress_error(op, "tools/list", e))?
                .value(&mut result);
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
        let input_schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
        // M19: what each call of this tool mirrors into headers, or why it is refused.
        self.header_params
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), stateless::header_params(&input_schema));
        Ok(ListedTool {
            name: name.to_string(),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            input_schema,
            output_schema: tool.get("outputSchema").cloned(),
            task_support: tool
                .pointer("/execution/taskSupport")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    fn require_tools(&self, session: &Session) -> Result<(), McpError> {
        if session.tools {
            Ok(())
        } else {
            Err(McpError::NoTools {
                server: self.server.name.clone(),
                protocol: session.protocol.clone(),
                via: if session.stateless {
                    "server/discover"
                } else {
                    "initialize"
                },
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
        let session = match slot.as_ref() {
            Some(session) => session.clone(),
            None => {
                let session = Arc::new(self.handshake(op).await?);
                *slot = Some(session.clone());
                session
            }
        };
        *op.protocol.lock().unwrap_or_else(|p| p.into_inner()) = Some(session.protocol.clone());
        Ok(session)
    }

    /// Drops the session if it is still the one that expired.
    async fn forget(&self, expired: &Arc<Session>) {
        let mut slot = self.session.lock().await;
        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, expired)) {
            *slot = None;
        }
    }

    /// M19, M2: the stateless revision when the server serves it (`server/discover`),
    /// else the `initialize` handshake. Every leg carries the signal.
    /// M19: what the store remembers of the server spares the probe: a server known to
    /// speak 2026-07-28 is spoken to at once, one known to be older gets `initialize`
    /// without `server/discover` first. What is learnt is remembered for the next process.
    async fn handshake(&self, op: &Operation<'_>) -> Result<Session, McpError> {
        if self.server.protocol == ProtocolPolicy::Handshake {
            return self.initialize(op).await;
        }
        match self.known_protocol().await {
            Some(known) if known.protocol == STATELESS_VERSION => {
                return Ok(Session {
                    id: None,
                    protocol: known.protocol,
                    tools: known.tools,
                    stateless: true,
                    remembered: true,
                    correlation: op.correlation.clone(),
                    no_standalone: AtomicBool::new(false),
                });
            }
            Some(_) => {
                let mut session = self.initialize(op).await?;
                session.remembered = true;
                return Ok(session);
            }
            None => {}
        }
        let (session, ttl) = match self.discover(op).await? {
            Some(found) => found,
            None => (self.initialize(op).await?, crate::known::HANDSHAKE_TTL),
        };
        self.remember(&session, ttl).await;
        Ok(session)
    }

    /// M19: the client's `_meta` for a 2026-07-28 request: the version, the capabilities
    /// (no sampling, no roots; elicitation only when the operator answers this server's
    /// questions) and who it is.
    fn request_meta(&self, version: &str) -> Map<String, Value> {
        let mut meta = Map::new();
        meta.insert(stateless::META_VERSION.into(), json!(version));
        meta.insert(
            stateless::META_CAPABILITIES.into(),
            self.client_capabilities(),
        );
        meta.insert(
            stateless::META_CLIENT_INFO.into(),
            json!({"name": "runwarden", "version": env!("CARGO_PKG_VERSION")}),
        );
        meta
    }

    /// M14: what the client declares it can do.
    fn client_capabilities(&self) -> Value {
        match self.server.elicitation {
            ElicitationPolicy::Operator => json!({"elicitation": {"form": {}}}),
            ElicitationPolicy::Decline => json!({}),
        }
    }

    /// M19: probes `server/discover` at 2026-07-28. `Some` when the server serves it; a
    /// server that refuses the version (-32022) naming 2026-07-28 among what it serves is
    /// asked once more; anything an older server answers (an HTTP error status, a
    /// JSON-RPC error, a result without 2026-07-28) is `None`, so the caller falls back
    /// to `initialize`. A failure that says nothing about the server's era (transport,
    /// cancel, budget) is the operation's error.
    async fn discover(&self, op: &Operation<'_>) -> Result<Option<(Session, Duration)>, McpError> {
        for attempt in 0..2 {
            let probe = Session {
                id: None,
                protocol: STATELESS_VERSION.into(),
                tools: false,
                stateless: true,
                remembered: false,
                correlation: None,
                no_standalone: AtomicBool::new(false),
            };
            let id = self.next_id();
            let message = json!({
                "jsonrpc": "2.0", "id": id, "method": "server/discover",
                "params": {"_meta": self.request_meta(STATELESS_VERSION)},
            });
            let answer = match self
                .leg(op, Some(&probe), "server/discover", message, Some(id))
                .await
            {
                Ok(answer) => answer,
                Err(McpError::UnsupportedVersion { supported, .. })
                    if attempt == 0 && supported.iter().any(|v| v == STATELESS_VERSION) =>
                {
                    continue;
                }
                Err(McpError::UnsupportedVersion { supported, .. })
                    if supported
                        .iter()
                        .any(|v| HANDSHAKE_VERSIONS.contains(&v.as_str())) =>
                {
                    return Ok(None);
                }
                Err(error @ McpError::UnsupportedVersion { .. }) => return Err(error),
                // A refused credential says nothing of the server's era, and is not sent
                // again to `initialize`.
                Err(
                    error @ McpError::Status {
                        status: 401 | 403, ..
                    },
                ) => return Err(error),
                Err(
                    McpError::Status { .. }
                    | McpError::Rpc { .. }
                    | McpError::Malformed { .. }
                    | McpError::EmptyBody { .. }
                    | McpError::ContentType { .. }
                    | McpError::Html { .. }
                    | McpError::NoResponse { .. },
                ) => return Ok(None),
                Err(error) => return Err(error),
            };
            let result = answer.message.unwrap_or(Value::Null);
            let serves = result
                .get("supportedVersions")
                .and_then(Value::as_array)
                .is_some_and(|v| v.iter().any(|v| v.as_str() == Some(STATELESS_VERSION)));
            if !serves {
                return Ok(None);
            }
            let session = Session {
                id: None,
                protocol: STATELESS_VERSION.into(),
                tools: result.pointer("/capabilities/tools").is_some(),
                stateless: true,
                remembered: false,
                correlation: op.correlation.clone(),
                no_standalone: AtomicBool::new(false),
            };
            return Ok(Some((session, crate::known::discover_ttl(&result))));
        }
        Ok(None)
    }

    /// M2: `initialize`, then `notifications/initialized`; both legs carry the signal.
    async fn initialize(&self, op: &Operation<'_>) -> Result<Session, McpError> {
        let id = self.next_id();
        let params = InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("runwarden", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25);
        let mut params = serde_json::to_value(params).unwrap_or_else(|_| json!({}));
        // M14: no sampling, no roots; elicitation (form mode) only when the operator
        // answers this server's questions.
        params["capabilities"] = self.client_capabilities();
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
        if protocol == OLD_HTTP_SSE_VERSION {
            return Err(McpError::Protocol {
                server: self.server.name.clone(),
                // It answered a Streamable HTTP initialize, so the transport is right: only
                // the version is too old.
                problem: format!(
                    "the server answered initialize with protocol version {OLD_HTTP_SSE_VERSION}, older than any runwarden speaks ({}, and {STATELESS_VERSION} through server/discover): upgrade the server to a release that speaks {} or newer",
                    HANDSHAKE_VERSIONS.join(", "),
                    HANDSHAKE_VERSIONS[HANDSHAKE_VERSIONS.len() - 1]
                ),
            });
        }
        if !HANDSHAKE_VERSIONS.contains(&protocol.as_str()) {
            return Err(McpError::Protocol {
                server: self.server.name.clone(),
                problem: format!(
                    "the server speaks protocol version {:?}; runwarden speaks {} (and {STATELESS_VERSION} through server/discover)",
                    one_line(&protocol),
                    HANDSHAKE_VERSIONS.join(", ")
                ),
            });
        }
        let session = Session {
            id: answer.response.header("mcp-session-id").map(str::to_string),
            protocol,
            tools: result.capabilities.tools.is_some(),
            stateless: false,
            remembered: false,
            correlation: op.correlation.clone(),
            no_standalone: AtomicBool::new(false),
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

    /// One POST through the vault (M1), bounded by what is left of the deadline (M3). A
    /// request's stream is listened to: the server's own requests in it are answered (M14).
    async fn leg(
        &self,
        op: &Operation<'_>,
        session: Option<&Session>,
        method: &str,
        message: Value,
        id: Option<i64>,
    ) -> Result<Answer, McpError> {
        let listen = session.map(Listen::plain);
        let spec = LegSpec {
            session,
            listen: listen.as_ref().filter(|_| id.is_some()),
            ..LegSpec::post(method, message, id)
        };
        self.leg_spec(op, spec).await
    }

    /// One HTTP exchange through the vault (M1), bounded by what is left of the deadline
    /// (M3), with the session's headers and `User-Agent` (M17).
    async fn leg_spec(
        &self,
        op: &Operation<'_>,
        mut spec: LegSpec<'_>,
    ) -> Result<Answer, McpError> {
        let mut step_ups = 0;
        let mut renewed = false;
        let mut nonces_tried = Vec::new();
        loop {
            let held = match &self.oauth {
                Some(oauth) => oauth
                    .credential(op.signal)
                    .await
                    .map_err(|e| self.auth_error(spec.method, e))?,
                None => None,
            };
            let credential = held.as_ref().map(|h| &h.credential);
            let response = self.leg_send(op, &mut spec, credential).await?;
            // M18: a 401 or 403 is the server's refusal before it dispatches the request
            // (RFC 6750 §3.1), so nothing of it ran, a `tools/call` included: the leg is
            // re-sent once after a renewal (a second 401 fails), and after each scope
            // step-up up to the vault's limit.
            if let Some(oauth) = &self.oauth
                && matches!(response.status, 401 | 403)
            {
                // RFC 9449 §9: the token stands, the proof lacked the server's new nonce.
                if oauth.retry_with_dpop_nonce(&response, &mut nonces_tried) {
                    continue;
                }
                if response.status == 401 && renewed {
                    return Err(McpError::Status {
                        server: self.server.name.clone(),
                        method: spec.method.into(),
                        status: 401,
                    });
                }
                oauth
                    .challenge(
                        response.status,
                        response.header("www-authenticate"),
                        held.as_ref(),
                        step_ups,
                        op.signal,
                    )
                    .await
                    .map_err(|e| self.auth_error(spec.method, e))?;
                if response.status == 403 {
                    step_ups += 1;
                } else {
                    renewed = true;
                }
                continue;
            }
            let had_session = spec.session.and_then(|s| s.id.as_deref()).is_some();
            return self.interpret(spec.method, response, spec.id, had_session);
        }
    }

    fn auth_error(&self, method: &str, error: OAuthError) -> McpError {
        match error {
            OAuthError::Cancelled { .. } => McpError::Cancelled {
                server: self.server.name.clone(),
                method: method.into(),
                in_flight: false,
            },
            error => McpError::Auth {
                server: self.server.name.clone(),
                method: method.into(),
                source: Box::new(error),
            },
        }
    }

    /// One HTTP exchange of a leg, with `credential` (an OAuth token) or the server's
    /// static one.
    async fn leg_send(
        &self,
        op: &Operation<'_>,
        spec: &mut LegSpec<'_>,
        credential: Option<&Credential>,
    ) -> Result<EgressResponse, McpError> {
        let server = &self.server.name;
        let method = spec.method;
        let Some(granted) = op.deadline.grant() else {
            return Err(McpError::NotSent {
                server: server.clone(),
                method: method.into(),
                budget: op.deadline.budget(),
            });
        };
        // M15: a stretchable leg is bounded by the hard maximum; its soft end is enforced
        // through the signal, so progress can move it while the leg is in flight.
        let bound = if op.deadline.stretches() {
            op.deadline.grant_hard().unwrap_or(granted)
        } else {
            granted
        };
        let mut request = EgressRequest::new(spec.http, self.server.url.clone())
            .header("user-agent", USER_AGENT)
            .timeout(bound)
            .max_response_bytes(self.server.max_response_bytes)
            .actor(self.actor.clone())
            .reason(if op.forced {
                format!("mcp {server} {method}, forced past the catalogue by the operator")
            } else {
                format!("mcp {server} {method}")
            });
        if let (Some(message), Some(session)) = (spec.message.as_mut(), spec.session)
            && session.stateless
            && message.get("id").is_some()
            && message.get("method").is_some()
        {
            // M19: every request of a 2026-07-28 connection carries the version, the
            // client's capabilities and identity in `_meta`, matching the version header.
            if !message.get("params").is_some_and(Value::is_object) {
                message["params"] = json!({});
            }
            let params = &mut message["params"];
            if !params.get("_meta").is_some_and(Value::is_object) {
                params["_meta"] = json!({});
            }
            if let Some(meta) = params["_meta"].as_object_mut() {
                meta.extend(self.request_meta(&session.protocol));
            }
        }
        if let Some(message) = &spec.message
            && let Some(name) = message.get("method").and_then(Value::as_str)
        {
            // M19: the method, and for the methods that name something the name, as
            // headers on every POST, so gateways route without reading the body.
            request = request.header("mcp-method", stateless::encode_header_value(name));
            let named = match name {
                "tools/call" | "prompts/get" => message.pointer("/params/name"),
                "resources/read" => message.pointer("/params/uri"),
                _ => None,
            };
            if let Some(named) = named.and_then(Value::as_str) {
                request = request.header("mcp-name", stateless::encode_header_value(named));
            }
        }
        for (name, value) in &spec.headers {
            request = request.header(name.clone(), value.clone());
        }
        request = match (&spec.message, &spec.last_event_id) {
            (Some(message), _) => {
                let body = serde_json::to_vec(message).expect("JSON values always serialize");
                request
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .body(body)
            }
            // M16: a GET that resumes the stream after the last event we read.
            (None, Some(last)) => request
                .header("accept", "text/event-stream")
                .header("last-event-id", last.clone()),
            // M14: the standalone GET stream.
            (None, None) if spec.http == Method::Get => {
                request.header("accept", "text/event-stream")
            }
            (None, None) => request,
        };
        if let Some(opened) = spec.standalone.as_mut().and_then(|s| s.opened.take()) {
            request = request.on_head(Box::new(move |status| {
                let _ = opened.send(status);
            }));
        }
        if let Some(session) = spec.session {
            if let Some(session_id) = &session.id {
                request = request.header("mcp-session-id", session_id.clone());
            }
            request = request.header("mcp-protocol-version", session.protocol.clone());
        }
        if let Some(auth) = credential.or(self.server.auth.as_ref()) {
            request = request.credential(auth.clone());
        }
        if let Some(correlation) = &op.correlation {
            request = request.correlation(correlation.clone());
        }
        if let Some(gate) = spec.gate.clone() {
            request = request.before_transfer(Box::new(move || (gate.0)()));
        }
        let intent = Arc::new(AtomicI64::new(0));
        let seen = intent.clone();
        request = request.on_intent(Box::new(move |id| seen.store(id, Ordering::Relaxed)));
        let started = Instant::now();
        let sent = self.exchange(op, request, spec).await;
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
        sent.map_err(|e| self.egress_error(op, method, e))
    }

    /// Sends one request through the vault. While a request's stream is open, the
    /// server's own requests in it are answered on other legs (M14) and its notices go to
    /// the caller (M15); what is still unanswered when the stream ends is dropped.
    async fn exchange(
        &self,
        op: &Operation<'_>,
        request: EgressRequest,
        spec: &LegSpec<'_>,
    ) -> Result<EgressResponse, EgressError> {
        let stretch = Stretch {
            caller: op.signal,
            deadline: &op.deadline,
        };
        let signal: Option<&dyn CancellationSignal> = if op.deadline.stretches() {
            Some(&stretch)
        } else {
            op.signal
        };
        // M14: a standalone stream also stops when its call ends.
        let until = spec.standalone.as_ref().map(|s| UntilEnded {
            inner: signal,
            ended: s.ended.clone(),
        });
        let signal = match &until {
            Some(until) => Some(until as &dyn CancellationSignal),
            None => signal,
        };
        let (id, standalone) = match (spec.id, &spec.standalone) {
            (Some(id), _) => (id, false),
            (None, Some(stream)) => (stream.call_id, true),
            (None, None) => return self.egress.send(request, signal).await,
        };
        let Some(listen) = spec.listen else {
            // An event stream may stay open after our answer: stop reading once it is in.
            let request = request.complete_when(Box::new(move |body: &[u8]| {
                std::str::from_utf8(body)
                    .is_ok_and(|text| sse::find_response(text, id, false).is_some())
            }));
            return self.egress.send(request, signal).await;
        };
        let (requests, mut inbox) = tokio::sync::mpsc::unbounded_channel();
        // A standalone stream's event ids are its own, never the call's resumption point.
        let marks = if standalone {
            Arc::default()
        } else {
            listen.marks.clone()
        };
        let mut watch = Watch::new(
            id,
            marks,
            Some(requests),
            listen.notices.clone(),
            listen.on_progress.clone(),
        );
        if standalone {
            watch = watch.standalone();
        }
        let request = request.complete_when(Box::new(move |body: &[u8]| watch.feed(body)));
        let (done, finished) = tokio::sync::watch::channel(false);
        let send = async {
            let sent = self.egress.send(request, signal).await;
            let _ = done.send(true);
            sent
        };
        let answer = async {
            let mut watching = finished.clone();
            loop {
                tokio::select! {
                    biased;
                    () = until_done(&mut watching) => return,
                    request = inbox.recv() => match request {
                        Some(request) => {
                            let mut stop = finished.clone();
                            tokio::select! {
                                () = self.answer(op, listen, request) => {}
                                () = until_done(&mut stop) => return,
                            }
                        }
                        None => return,
                    },
                }
            }
        };
        let (sent, ()) = tokio::join!(send, answer);
        sent
    }

    /// M14: answers one request the server sent in a stream, at once (an elicitation
    /// waits for its elicitor, within the operation's budget).
    async fn answer(&self, op: &Operation<'_>, listen: &Listen<'_>, request: ServerRequest) {
        let (label, reply) = match request.method.as_str() {
            "ping" => ("ping answer", json!({"result": {}})),
            "elicitation/create" => (
                "elicitation answer",
                json!({"result": self.elicit(op, listen, &request.params).await}),
            ),
            "sampling/createMessage" => (
                "sampling refusal",
                refusal("runwarden does not offer sampling (the capability is not declared)"),
            ),
            "roots/list" => (
                "roots refusal",
                refusal("runwarden does not offer roots (the capability is not declared)"),
            ),
            _ => (
                "unknown request refusal",
                refusal("method not found: runwarden does not handle this request"),
            ),
        };
        let mut message = reply;
        message["jsonrpc"] = json!("2.0");
        message["id"] = request.id;
        let sent = Box::pin(self.leg(op, Some(listen.session), label, message, None)).await;
        if let Err(error) = sent {
            tracing::info!(server = %self.server.name, %error, "the answer to a server request did not reach it");
        }
    }

    /// M14: the answer to `elicitation/create`. With the operator policy and an elicitor
    /// on the call, the elicitor is asked and given what is left of the budget (less a
    /// second for the answer's own leg); anything else, URL mode included, and an elicitor
    /// that does not answer in time, is a decline.
    async fn elicit(&self, op: &Operation<'_>, listen: &Listen<'_>, params: &Value) -> Value {
        let decline = json!({"action": "decline"});
        let form = params.get("mode").and_then(Value::as_str).unwrap_or("form") == "form";
        let (true, ElicitationPolicy::Operator, Some(elicitor)) =
            (form, self.server.elicitation, listen.elicitor)
        else {
            return decline;
        };
        let timeout = op
            .deadline
            .remaining()
            .saturating_sub(MIN_LEG.min(op.deadline.floor()));
        if timeout.is_zero() {
            return decline;
        }
        let message: String = params
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .chars()
            .take(2_000)
            .collect();
        let request = ElicitationRequest {
            server: self.server.name.clone(),
            tool: listen.tool.unwrap_or_default().to_string(),
            message,
            requested_schema: params
                .get("requestedSchema")
                .cloned()
                .unwrap_or(Value::Null),
            timeout,
        };
        match tokio::time::timeout(timeout, elicitor.0.elicit(request)).await {
            Ok(ElicitationAnswer::Accept(content)) => {
                json!({"action": "accept", "content": content})
            }
            Ok(ElicitationAnswer::Cancel) => json!({"action": "cancel"}),
            Ok(ElicitationAnswer::Decline) | Err(_) => decline,
        }
    }

    /// M13: ends the session with `DELETE`, bounded by [`CLOSE_BUDGET`] and with no signal
    /// (it runs when the process shuts down, after any cancel). A server that issued no
    /// session id has nothing to end; 404 (already gone) and 405 (the server does not let
    /// clients end sessions) count as ended. The next operation starts a new session.
    pub async fn close(&self) -> Result<(), McpError> {
        let Some(session) = self.session.lock().await.take() else {
            return Ok(());
        };
        if session.id.is_none() {
            return Ok(());
        }
        // The row of the DELETE carries the run tag of the operation that opened it.
        let op = Operation {
            deadline: Deadline::start(&*self.clock, CLOSE_BUDGET),
            signal: None,
            correlation: session.correlation.clone(),
            legs: Mutex::default(),
            protocol: Mutex::default(),
            forced: false,
        };
        let spec = LegSpec {
            http: Method::Delete,
            method: "session end",
            session: Some(&session),
            message: None,
            id: None,
            gate: None,
            last_event_id: None,
            listen: None,
            standalone: None,
            headers: Vec::new(),
        };
        match self.leg_spec(&op, spec).await {
            Ok(_)
            | Err(McpError::SessionExpired { .. })
            | Err(McpError::Status { status: 405, .. })
            | Err(McpError::Rpc {
                status: Some(405), ..
            }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn egress_error(&self, op: &Operation<'_>, method: &str, error: EgressError) -> McpError {
        let (server, method) = (self.server.name.clone(), method.to_string());
        // M15: a stretchable leg stopped by its soft end, not by the caller, stalled.
        let stalled =
            op.deadline.stretches() && !op.caller_cancelled() && op.deadline.remaining().is_zero();
        match error {
            EgressError::CancelledBeforeSend | EgressError::CancelledInFlight { .. } if stalled => {
                McpError::Stalled {
                    server,
                    method,
                    budget: op.deadline.budget(),
                }
            }
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
        if let Some(supported) = unsupported_version(&response) {
            return Err(McpError::UnsupportedVersion {
                server,
                method: method_s,
                supported,
            });
        }
        if !response.is_success() {
            // M5: a JSON-RPC error in the body of an HTTP error is the server's own words.
            if let Some((code, message)) = rpc_error_in(&response) {
                return Err(McpError::Rpc {
                    server,
                    method: method_s,
                    status: Some(response.status),
                    code,
                    message,
                });
            }
            return Err(McpError::Status {
                server,
                method: method_s,
                status: response.status,
            });
        }
        if response.truncated {
            return Err(self.too_large(method, &response, id));
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
                status: None,
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

impl McpClient {
    /// M5: a 2xx answer cut at `max_response_bytes`. It names the size when the server
    /// declared one, and whether the server had finished the request: a JSON body is
    /// written once the request is done; a stream had begun the response to our id.
    fn too_large(&self, method: &str, response: &EgressResponse, id: Option<i64>) -> McpError {
        let size = response
            .header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        let content_type = response.header("content-type").unwrap_or("");
        let complete = if content_type
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
        {
            true
        } else {
            id.is_some_and(|id| sse::response_begun(&String::from_utf8_lossy(&response.body), id))
        };
        McpError::TooLarge {
            server: self.server.name.clone(),
            method: method.into(),
            limit: self.server.max_response_bytes,
            size,
            complete,
        }
    }
}

/// M5: the code and message of a JSON-RPC error in a JSON body (one line, cut short).
fn rpc_error_in(response: &EgressResponse) -> Option<(i64, String)> {
    let json = response.header("content-type").is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
    });
    if !json || response.truncated {
        return None;
    }
    let message: Value = serde_json::from_slice(&response.body).ok()?;
    let error = message.get("error")?;
    let code = error.get("code").and_then(Value::as_i64)?;
    let text = error.get("message").and_then(Value::as_str).unwrap_or("");
    Some((code, one_line(text)))
}

/// M19: the versions a server names when it refuses ours (JSON-RPC -32022, with or
/// without an HTTP error status), each cut to one short line.
fn unsupported_version(response: &EgressResponse) -> Option<Vec<String>> {
    let json = response.header("content-type").is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
    });
    if !json || response.truncated {
        return None;
    }
    let message: Value = serde_json::from_slice(&response.body).ok()?;
    let error = message.get("error")?;
    if error.get("code").and_then(Value::as_i64) != Some(stateless::UNSUPPORTED_VERSION) {
        return None;
    }
    Some(
        error
            .pointer("/data/supported")
            .and_then(Value::as_array)
            .map(|versions| {
                versions
                    .iter()
                    .filter_map(Value::as_str)
                    .take(8)
                    .map(|v| one_line(v).chars().take(32).collect())
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// M14: a JSON-RPC error for a request whose capability we never declared.
fn refusal(message: &str) -> Value {
    json!({"error": {"code": METHOD_NOT_FOUND, "message": message}})
}

/// Resolves once the flag is true (or its sender is gone). Holds no borrow of the value
/// across an await, so the future stays `Send`.
async fn until_done(flag: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        let done = *flag.borrow_and_update();
        if done || flag.changed().await.is_err() {
            return;
        }
    }
}

/// Resolves once `signal` is cancelled: on its wake-up when it has one, else by asking it
/// every [`runwarden_vault::MAX_TICK`] (V6), as the vault does while a call is in flight.
async fn until_cancelled(signal: &dyn CancellationSignal) {
    loop {
        if signal.is_cancelled() {
            return;
        }
        if signal.wakes() {
            signal.woken().await;
        } else {
            tokio::time::sleep(runwarden_vault::MAX_TICK).await;
        }
    }
}
