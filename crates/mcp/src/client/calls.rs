//! `tools/call`: the request, the gate that runs just before its first byte, the
//! questions it may raise, its standalone stream, and the notice after an abandoned call.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CancelledNotificationParam, NumberOrString};
use runwarden_vault::{CancellationSignal, Delivery, Method};
use serde_json::{Map, Value, json};

use super::listen::Listen;
use super::operation::LegReport;
use super::transport::LegSpec;
use super::{McpClient, Operation, Session};
use crate::config::{ElicitationPolicy, PROGRESS_HARD_MAX};
use crate::deadline::Deadline;
use crate::error::McpError;
use crate::result::ToolResult;
use crate::stateless::{InputRequired, InputResume, MAX_INPUT_ROUNDS};
use crate::stream::{NoticeSink, OnProgress};

/// M14: the longest a `tools/call` waits for its standalone GET stream to open, so that a
/// question the server sends on it at once is not lost.
const STANDALONE_OPEN_WAIT: Duration = Duration::from_secs(1);

/// The budget of the best-effort `notifications/cancelled` after a torn-down call (M4).
const CANCEL_NOTICE_BUDGET: Duration = Duration::from_secs(2);

/// What a [`CallGate`] returns: `Err` with the reason refuses the call.
pub type GateFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Runs once the session is ready, after the vault committed the audit intent of
/// `tools/call` and just before its first byte leaves; an `Err` stops the call unsent. The runtime stamps its write fence here (R11), so a
/// crash during the handshake never leaves a run fenced for a write that never left.
#[derive(Clone)]
pub struct CallGate(pub(super) Arc<dyn Fn() -> GateFuture + Send + Sync>);

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

/// One `tools/call` to send to an MCP server, with what the caller hangs on it (a gate, an
/// elicitor, a notice sink). Not the call a model asks for: that is the models crate's
/// `ToolCallRequest`.
#[derive(Debug, Clone, Default)]
pub struct McpCall {
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
    /// G2: answers the server's `sampling/createMessage` during this call, when the
    /// server's configuration passes them on; with none, the client refuses at once.
    pub sampler: Option<crate::SamplerHandle>,
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

/// M14: what the standalone GET stream of one `tools/call` needs: the call it serves, the
/// flag that ends it with the call, and who waits for it to open.
pub(super) struct Standalone {
    pub(super) call_id: i64,
    pub(super) ended: tokio::sync::watch::Receiver<bool>,
    pub(super) opened: Option<tokio::sync::oneshot::Sender<u16>>,
}

impl McpClient {
    /// Calls a tool: handshake if needed, then `tools/call`, all under one deadline and the
    /// caller's signal (seam 1 of 3). Never an error: failures are results (M12) that say
    /// how far the call got (V8). Every `tools/call` we stop waiting for after it may have
    /// reached the server is followed by a bounded `notifications/cancelled` (M4).
    pub async fn call_tool(
        &self,
        call: McpCall,
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
            // Boxed, as the handshake is (see `session`): rare, and large.
            Box::pin(self.notify_cancelled(id, reason, call.correlation.clone())).await;
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
        call: &McpCall,
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
            // Boxed, as the handshake is (see `session`): rare, and large.
            resume = Some(Box::pin(self.answer_inputs(op, &session, call, &asked)).await?);
        }
    }

    /// One `tools/call` request (with a resumed one's answers), its stream listened to.
    async fn call_once(
        &self,
        op: &Operation<'_>,
        session: &Arc<Session>,
        call: &McpCall,
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
            sampler: call.sampler.as_ref(),
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
            // Boxed: only a session's calls open the stream, so a stateless call's state
            // does not hold room for a second leg while it waits.
            let standalone = Box::pin(self.standalone(op, &listen, stream));
            let (answered, ()) = tokio::join!(post, standalone);
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
}
