//! One leg: one HTTP exchange through the vault, bounded by what is left of the
//! operation's deadline, with the session's headers, the credential (an OAuth token when
//! the server uses OAuth, renewed on a refusal) and the event stream listened to.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use runwarden_vault::{
    CancellationSignal, Credential, EgressError, EgressRequest, EgressResponse, Method,
};
use serde_json::Value;

use super::calls::{CallGate, Standalone};
use super::listen::Listen;
use super::operation::LegReport;
use super::signal::{Stretch, UntilEnded, until_done};
use super::stateless::routing_headers;
use super::{McpClient, Operation, Session};
use crate::error::McpError;
use crate::sse;

use crate::stream::Watch;

/// `User-Agent` on every request (M17).
pub const USER_AGENT: &str = concat!("runwarden/", env!("CARGO_PKG_VERSION"));

/// What one leg sends, beyond its operation.
pub(super) struct LegSpec<'s> {
    pub(super) http: Method,
    /// The JSON-RPC method (or what the leg is for), for reports, audit and errors.
    pub(super) method: &'s str,
    /// The session whose headers the leg carries (none for `initialize`).
    pub(super) session: Option<&'s Session>,
    /// The POST body.
    pub(super) message: Option<Value>,
    /// Our request id, when a response is due.
    pub(super) id: Option<i64>,
    pub(super) gate: Option<CallGate>,
    /// M16: a GET that resumes a stream after this event.
    pub(super) last_event_id: Option<String>,
    /// How the leg answers what the server sends in its stream.
    pub(super) listen: Option<&'s Listen<'s>>,
    /// M14: the leg is the standalone GET stream of a call.
    pub(super) standalone: Option<Standalone>,
    /// M19: the call's mirrored `Mcp-Param-*` headers.
    pub(super) headers: Vec<(String, String)>,
}

impl<'s> LegSpec<'s> {
    pub(super) fn post(method: &'s str, message: Value, id: Option<i64>) -> Self {
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

/// A leg's answer: the response message (for requests) and the HTTP headers.
pub(super) struct LegAnswer {
    pub(super) message: Option<Value>,
    pub(super) response: EgressResponse,
}

impl McpClient {
    /// One POST through the vault (M1), bounded by what is left of the deadline (M3). A
    /// request's stream is listened to: the server's own requests in it are answered (M14).
    pub(super) async fn leg(
        &self,
        op: &Operation<'_>,
        session: Option<&Session>,
        method: &str,
        message: Value,
        id: Option<i64>,
    ) -> Result<LegAnswer, McpError> {
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
    pub(super) async fn leg_spec(
        &self,
        op: &Operation<'_>,
        mut spec: LegSpec<'_>,
    ) -> Result<LegAnswer, McpError> {
        if let Some(local) = &self.local {
            return self.local_leg(op, local, spec).await;
        }
        let mut step_ups = 0;
        let mut renewed = false;
        let mut nonces_tried = Vec::new();
        loop {
            // The OAuth client's states (a token read, a renewal, a challenge) are boxed:
            // inline, they would set the size of every leg's state, held for as long as
            // the leg waits on the wire.
            let held = match &self.oauth {
                Some(oauth) => Box::pin(oauth.credential(op.signal))
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
                Box::pin(oauth.challenge(
                    response.status,
                    response.header("www-authenticate"),
                    held.as_ref(),
                    step_ups,
                    op.signal,
                ))
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

    /// One HTTP exchange of a leg, with `credential` (an OAuth token) or the server's
    /// static one; its report joins the operation's legs whatever the outcome.
    async fn leg_send(
        &self,
        op: &Operation<'_>,
        spec: &mut LegSpec<'_>,
        credential: Option<&Credential>,
    ) -> Result<EgressResponse, McpError> {
        let method = spec.method;
        let Some(granted) = op.deadline.grant() else {
            return Err(McpError::NotSent {
                server: self.server.name.clone(),
                method: method.into(),
                budget: op.deadline.budget(),
            });
        };
        let request = self.leg_request(op, spec, credential, granted);
        let intent = Arc::new(AtomicI64::new(0));
        let seen = intent.clone();
        let request = request.on_intent(Box::new(move |id| seen.store(id, Ordering::Relaxed)));
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

    /// The request of one leg, bounded by `granted`: who sends it and why, its body (or
    /// what a GET asks for), the session's headers, the credential and the call's gate.
    fn leg_request(
        &self,
        op: &Operation<'_>,
        spec: &mut LegSpec<'_>,
        credential: Option<&Credential>,
        granted: Duration,
    ) -> EgressRequest {
        let (server, method) = (&self.server.name, spec.method);
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
        if let (Some(message), Some(session)) = (spec.message.as_mut(), spec.session) {
            self.stamp_request_meta(message, session);
        }
        if let Some(message) = &spec.message {
            request = routing_headers(request, message);
        }
        for (name, value) in &spec.headers {
            request = request.header(name.clone(), value.clone());
        }
        request = with_body(request, spec);
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
        request
    }

    /// Sends one request through the vault. While a request's stream is open, the
    /// server's own requests in it are answered on other legs (M14) and its notices go to
    /// the caller (M15); an answer still waiting for a person when the stream ends is
    /// dropped, one already being sent is finished.
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
                            // An answer still being made (an elicitation waiting for
                            // a person) is dropped when the stream ends; one being sent
                            // is finished (within the operation's budget), so the server
                            // is never left with half an answer and the leg is recorded.
                            // Both boxed: a server's question is rare, and inline their
                            // states would double what every leg holds while it waits.
                            let mut stop = finished.clone();
                            let answer = tokio::select! {
                                answer = Box::pin(self.answer_to(op, listen, request)) => answer,
                                () = until_done(&mut stop) => return,
                            };
                            Box::pin(self.send_answer(op, listen, answer)).await;
                        }
                        None => return,
                    },
                }
            }
        };
        let (sent, ()) = tokio::join!(send, answer);
        sent
    }

    pub(super) fn egress_error(
        &self,
        op: &Operation<'_>,
        method: &str,
        error: EgressError,
    ) -> McpError {
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

    pub(super) fn malformed(&self, method: &str, problem: &str) -> McpError {
        McpError::Malformed {
            server: self.server.name.clone(),
            method: method.into(),
            problem: problem.into(),
        }
    }
}

/// The leg's body with its content type, or what its GET asks for.
fn with_body(request: EgressRequest, spec: &LegSpec<'_>) -> EgressRequest {
    match (&spec.message, &spec.last_event_id) {
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
        (None, None) if spec.http == Method::Get => request.header("accept", "text/event-stream"),
        (None, None) => request,
    }
}
