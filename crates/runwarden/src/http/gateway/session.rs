//! One client's MCP session: its run, its tools, its calls in flight, and the task that
//! holds the run while the session lasts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_mcp::{
    ElicitationAnswer, ElicitationFuture, ElicitationRequest, Elicitor, ElicitorHandle, NoticeSink,
    Sampler, SamplerHandle, SamplingFuture, SamplingRequest,
};
use runwarden_runtime::gateway::{GATEWAY_TAG, GatewayCall, GatewayReply, GatewayRequest};
use runwarden_runtime::{AgentSpec, Executor, RunOrigin};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

/// How many calls may wait for the session's segment at once.
const QUEUE: usize = 256;

/// A live session.
pub(crate) struct Session {
    /// The session's run (also its `Mcp-Session-Id`).
    pub(crate) run_id: String,
    /// The hash of the token that opened it: only that token may use it.
    pub(crate) token: [u8; 32],
    /// The token's name, for the run and the log.
    pub(crate) token_name: String,
    /// The version the session speaks.
    pub(crate) version: &'static str,
    /// What the client declared it answers.
    pub(crate) answers: Answers,
    /// The client's answers awaited, by the id of the question sent to it.
    asked: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// What the client may call; a reload may change it.
    tools: watch::Sender<Arc<AgentSpec>>,
    /// The client's standing event stream (`GET /mcp`), while it is open.
    stream: Mutex<Option<mpsc::UnboundedSender<Value>>>,
    calls: mpsc::Sender<GatewayRequest>,
    /// Each call in flight, by the client's request id (as JSON text).
    open: Mutex<HashMap<String, OpenCall>>,
    /// When the client last sent anything.
    last_seen: Mutex<Instant>,
    /// The task that holds the run, to wait for when the server stops.
    holder: Mutex<Option<tokio::task::JoinHandle<()>>>,
    executor: Arc<Executor>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("run_id", &self.run_id)
            .field("token_name", &self.token_name)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens the session's run and starts the task that holds it; `ended` is called with
    /// the run's id once the run is over.
    pub(crate) async fn open(
        executor: Arc<Executor>,
        agent: AgentSpec,
        (token, token_name): ([u8; 32], &str),
        (client, answers): (&str, Answers),
        version: &'static str,
        ended: impl FnOnce(&str) + Send + 'static,
    ) -> anyhow::Result<Arc<Self>> {
        let origin = RunOrigin {
            started_by: Some(token_name.to_string()),
            tags: vec![GATEWAY_TAG.to_string()],
        };
        let run = executor.open_gateway(origin).await?;
        let (tools, watching) = watch::channel(Arc::new(agent));
        let (calls, requests) = mpsc::channel(QUEUE);
        let about = format!("MCP session of {client} with token {token_name}");
        let session = Arc::new(Self {
            run_id: run.id.clone(),
            token,
            token_name: token_name.to_string(),
            version,
            answers,
            asked: Mutex::default(),
            tools,
            stream: Mutex::default(),
            calls,
            open: Mutex::default(),
            last_seen: Mutex::new(Instant::now()),
            holder: Mutex::default(),
            executor: executor.clone(),
        });
        let holder = tokio::spawn(async move {
            let outcome = executor
                .serve_gateway(&run, watching, &about, requests)
                .await;
            tracing::info!(run = %run.id, outcome = outcome.as_str(), "gateway session ended");
            ended(&run.id);
        });
        *session.holder.lock().unwrap_or_else(|p| p.into_inner()) = Some(holder);
        Ok(session)
    }

    /// What the client may call now.
    pub(crate) fn agent(&self) -> Arc<AgentSpec> {
        self.tools.borrow().clone()
    }

    /// G2: puts `agent` in force for the session's next calls when its tools differ from
    /// those in force, and tells the client on its standing stream that the list changed.
    pub(crate) fn update(&self, agent: AgentSpec) {
        if super::wire::tools(&agent) == super::wire::tools(&self.agent()) {
            return;
        }
        self.tools.send_replace(Arc::new(agent));
        let changed =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stream) = stream.as_ref() {
            let _ = stream.send(changed);
        }
    }

    /// The client's standing stream, opened now (a second replaces the first).
    pub(crate) fn listen(&self) -> mpsc::UnboundedReceiver<Value> {
        let (sender, receiver) = mpsc::unbounded_channel();
        *self.stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender);
        receiver
    }

    /// The task that holds the run, once.
    pub(crate) fn holder(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.holder.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Notes that the client is still there.
    pub(crate) fn seen(&self) {
        *self.last_seen.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// True when the client sent nothing for `idle` and no call is open.
    pub(crate) fn idle_for(&self, idle: Duration) -> bool {
        let quiet = self
            .last_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            >= idle;
        quiet
            && self
                .open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// Makes one call and waits for its answer. The call is stopped when the returned
    /// future is dropped (the client went away) or [`cancel`](Self::cancel) names it.
    pub(crate) async fn call(
        &self,
        request_id: &Value,
        tool: String,
        arguments: Value,
        (notices, asker): (Option<NoticeSink>, Option<Arc<ClientAsker>>),
    ) -> GatewayReply {
        let key = request_id.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let by_operator = Arc::new(AtomicBool::new(false));
        let call_id = format!("gw-{}", request_id_text(request_id));
        let open = OpenCall {
            call_id: call_id.clone(),
            tool: tool.clone(),
            started_ms: runwarden_base::now_ms(),
            stop: stop.clone(),
            by_operator: by_operator.clone(),
        };
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), open);
        let guard = Open {
            session: self,
            key,
            stop: stop.clone(),
            done: false,
        };
        let (reply, answer) = oneshot::channel();
        let call = GatewayCall {
            call_id,
            tool,
            arguments,
            stop,
            notices,
            elicitor: asker
                .clone()
                .filter(|_| self.answers.elicitation)
                .map(|a| ElicitorHandle(a)),
            sampler: asker
                .filter(|_| self.answers.sampling)
                .map(|a| SamplerHandle(a)),
        };
        let ended = GatewayReply::Ended {
            outcome: runwarden_runtime::Outcome::Cancelled,
            uncertain: false,
        };
        let answer = match self.calls.send(GatewayRequest { call, reply }).await {
            Ok(()) => answer.await.unwrap_or(ended),
            Err(_) => ended,
        };
        guard.finish();
        match answer {
            // The stop was an operator's, for this call alone; the session goes on.
            GatewayReply::CancelledByClient { uncertain } if by_operator.load(Ordering::SeqCst) => {
                GatewayReply::CancelledByOperator { uncertain }
            }
            answer => answer,
        }
    }

    /// The calls in flight: `(call id, tool, started, Unix ms)`, oldest first.
    pub(crate) fn open_calls(&self) -> Vec<(String, String, i64)> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let mut calls: Vec<(String, String, i64)> = open
            .values()
            .map(|c| (c.call_id.clone(), c.tool.clone(), c.started_ms))
            .collect();
        calls.sort_by_key(|c| c.2);
        calls
    }

    /// An operator stops one call in flight, by its call id; `false` when none is open.
    pub(crate) fn cancel_call(&self, call_id: &str) -> bool {
        let found = {
            let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            open.values()
                .find(|c| c.call_id == call_id)
                .map(|c| (c.stop.clone(), c.by_operator.clone()))
        };
        let Some((stop, by_operator)) = found else {
            return false;
        };
        by_operator.store(true, Ordering::SeqCst);
        self.stop(&stop);
        true
    }

    /// The client's `notifications/cancelled` for one of its requests: stops that call.
    pub(crate) fn cancel(&self, request_id: &Value) {
        let stop = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&request_id.to_string())
            .map(|c| c.stop.clone());
        if let Some(stop) = stop {
            self.stop(&stop);
        }
    }

    /// The client's answer to a question the gateway sent it.
    pub(crate) fn answered(&self, id: &Value, message: Value) {
        let waiting = self
            .asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request_id_text(id));
        if let Some(waiting) = waiting {
            let _ = waiting.send(message);
        }
    }

    /// Stops one call: its flag, then a wake-up so its signal asks at once.
    fn stop(&self, stop: &AtomicBool) {
        stop.store(true, Ordering::SeqCst);
        self.executor.watcher().hub().wake(&self.run_id);
    }
}

/// A call in flight; dropped before it finished (the client went away), it stops the call.
/// A call in flight.
struct OpenCall {
    /// Its id in the run's steps (`gw-` and the client's request id).
    call_id: String,
    /// The tool's local name.
    tool: String,
    /// When it started, Unix milliseconds UTC.
    started_ms: i64,
    /// Stops it.
    stop: Arc<AtomicBool>,
    /// Set when an operator stopped it.
    by_operator: Arc<AtomicBool>,
}

struct Open<'s> {
    session: &'s Session,
    key: String,
    stop: Arc<AtomicBool>,
    done: bool,
}

impl Open<'_> {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.session.stop(&self.stop);
        }
        self.session
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

/// A request id as a call id's suffix: a number as digits, a string as is (at most 64
/// characters, each outside `A-Z a-z 0-9 - _ .` as `_`, so the id is safe in a path).
fn request_id_text(id: &Value) -> String {
    let text = match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.chars()
        .take(64)
        .map(|c| match c.is_ascii_alphanumeric() || "-_.".contains(c) {
            true => c,
            false => '_',
        })
        .collect()
}

/// What a client declared it answers of a server's requests.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Answers {
    /// `elicitation/create`.
    pub(crate) elicitation: bool,
    /// `sampling/createMessage`.
    pub(crate) sampling: bool,
}

impl Answers {
    /// From the client's `capabilities` at `initialize`.
    pub(crate) fn declared(capabilities: &Value) -> Self {
        Self {
            elicitation: capabilities
                .get("elicitation")
                .is_some_and(Value::is_object),
            sampling: capabilities.get("sampling").is_some_and(Value::is_object),
        }
    }

    /// True when the client answers anything.
    pub(crate) fn any(self) -> bool {
        self.elicitation || self.sampling
    }
}

/// G2: passes a server's requests during a call (its questions, its sampling) to the
/// client that made the call, on the call's event stream; the client answers with a POST
/// of its own, which [`Session::answered`] hands back here.
pub(crate) struct ClientAsker {
    pub(crate) session: Arc<Session>,
    pub(crate) events: mpsc::UnboundedSender<Value>,
}

impl ClientAsker {
    /// Sends `method` with `params` to the client; its answer (the whole message), or
    /// `None` when it did not come within `timeout` or the stream is gone.
    async fn ask(
        &self,
        method: &str,
        params: Value,
        timeout: std::time::Duration,
    ) -> Option<Value> {
        let id = format!("runwarden-ask-{}", uuid::Uuid::now_v7());
        let (reply, answer) = oneshot::channel();
        let asked = &self.session.asked;
        asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), reply);
        let request =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let answered = match self.events.send(request) {
            Ok(()) => tokio::time::timeout(timeout, answer)
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        };
        asked.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        answered
    }
}

impl Elicitor for ClientAsker {
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture {
        let asker = ClientAsker {
            session: self.session.clone(),
            events: self.events.clone(),
        };
        Box::pin(async move {
            tracing::info!(run = %asker.session.run_id, server = %request.server, tool = %request.tool, "a server's question goes to the gateway client");
            let params = serde_json::json!({"message": request.message, "requestedSchema": request.requested_schema});
            let answered = asker
                .ask("elicitation/create", params, request.timeout)
                .await;
            answered.map_or(ElicitationAnswer::Decline, |message| {
                client_answer(&message)
            })
        })
    }
}

impl Sampler for ClientAsker {
    fn sample(&self, request: SamplingRequest) -> SamplingFuture {
        let asker = ClientAsker {
            session: self.session.clone(),
            events: self.events.clone(),
        };
        Box::pin(async move {
            tracing::info!(run = %asker.session.run_id, server = %request.server, tool = %request.tool, "a server's sampling request goes to the gateway client");
            let answered = asker
                .ask("sampling/createMessage", request.params, request.timeout)
                .await?;
            answered.get("result").filter(|r| r.is_object()).cloned()
        })
    }
}

/// The client's answer as the server hears it: accept with its content, cancel, or
/// decline (for a decline, an error, or anything else).
fn client_answer(message: &Value) -> ElicitationAnswer {
    let result = &message["result"];
    match result["action"].as_str() {
        Some("accept") => match &result["content"] {
            Value::Object(content) => ElicitationAnswer::Accept(content.clone()),
            _ => ElicitationAnswer::Accept(serde_json::Map::new()),
        },
        Some("cancel") => ElicitationAnswer::Cancel,
        _ => ElicitationAnswer::Decline,
    }
}
