//! One leg to a local (stdio) server: the message written as one line on its stdin, its
//! answer read from its stdout, under the same deadline, signal, gate and audit rows as
//! an HTTP leg. An `initialize` starts a fresh process; every other leg goes to the
//! process its session was made with, and fails unsent when that one has ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_vault::audit::action;
use runwarden_vault::{AuditEvent, EgressError, EgressResponse};
use serde_json::Value;

use super::listen::Listen;
use super::operation::LegReport;
use super::signal::{Stretch, until_cancelled};
use super::transport::{LegAnswer, LegSpec};
use super::{McpClient, Operation};
use crate::error::{McpError, one_line};
use crate::stdio::{LocalServer, Process};
use crate::stream::Watch;

/// How a local leg ended, for its audit row.
struct Ended {
    answered: bool,
    error: Option<String>,
}

impl McpClient {
    /// One leg to a local server (see the module's comment).
    pub(super) async fn local_leg(
        &self,
        op: &Operation<'_>,
        local: &LocalServer,
        spec: LegSpec<'_>,
    ) -> Result<LegAnswer, McpError> {
        let method = spec.method;
        let Some(granted) = op.deadline.grant() else {
            return Err(McpError::NotSent {
                server: self.server.name.clone(),
                method: method.into(),
                budget: op.deadline.budget(),
            });
        };
        // A session end has nothing to send: the process is stopped by `close`.
        let Some(message) = spec.message.clone() else {
            return Ok(answer(None, None));
        };
        self.refuse_secrets(method, &message).await?;
        let process = match spec.session {
            None => local.fresh(granted).await,
            Some(session) => local.current(session.generation).ok_or_else(|| {
                let why = local
                    .last_exit()
                    .unwrap_or_else(|| "it was stopped".to_string());
                format!("its process ended ({why}); the next operation starts it again")
            }),
        }
        .map_err(|problem| self.local_error(method, problem, false))?;
        let started = Instant::now();
        let intent = self
            .local_row(op, action::STDIO_CALL_STARTED, method, None, started)
            .await
            .map_err(|problem| self.local_error(method, problem, false))?;
        // R11: the gate (the runtime's write fence) runs after the intent is durable and
        // right before the first byte.
        if let Some(gate) = &spec.gate
            && let Err(reason) = (gate.0)().await
        {
            let ended = Ended {
                answered: false,
                error: Some(format!("not sent: {reason}")),
            };
            self.local_done(op, method, intent, &ended, started).await;
            return Err(McpError::Gated {
                server: self.server.name.clone(),
                reason,
            });
        }
        let in_flight = process.begin();
        let outcome = self
            .local_exchange(op, &process, &spec, &message, granted)
            .await;
        drop(in_flight);
        let ended = Ended {
            answered: outcome.is_ok(),
            error: outcome.as_ref().err().map(|e| one_line(&e.to_string())),
        };
        self.local_done(op, method, intent, &ended, started).await;
        op.legs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(LegReport {
                method: method.into(),
                granted,
                elapsed: started.elapsed(),
                answered: outcome.is_ok(),
                audit_id: Some(intent),
            });
        let reply = outcome?;
        if let Some(error) = reply.as_ref().and_then(|m| m.get("error")) {
            return Err(McpError::Rpc {
                server: self.server.name.clone(),
                method: method.into(),
                status: None,
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: one_line(error.get("message").and_then(Value::as_str).unwrap_or("")),
            });
        }
        Ok(answer(
            reply.and_then(|m| m.get("result").cloned()),
            Some(intent),
        ))
    }

    /// Writes the message and, for a request, waits for its answer while the server's
    /// progress, log lines and own requests are handled as in an HTTP stream.
    async fn local_exchange(
        &self,
        op: &Operation<'_>,
        process: &Arc<Process>,
        spec: &LegSpec<'_>,
        message: &Value,
        granted: Duration,
    ) -> Result<Option<Value>, McpError> {
        let method = spec.method;
        let mut pending = spec.id.map(|id| process.link.expect(id));
        // A line is never cut short: a write that does not finish within the budget
        // leaves the pipe unusable, so the process is given up.
        match tokio::time::timeout(granted, process.link.write(message)).await {
            Ok(Ok(())) => {}
            Ok(Err(failed)) => {
                let problem = format!("writing to its stdin failed ({})", failed.detail);
                return Err(self.local_error(method, problem, failed.partly));
            }
            Err(_) => {
                if let Some(id) = spec.id {
                    process.abandoned(id, Duration::ZERO);
                }
                let problem = "its stdin took no input within the budget".to_string();
                return Err(self.local_error(method, problem, true));
            }
        }
        let (Some(id), Some(pending)) = (spec.id, pending.as_mut()) else {
            return Ok(None);
        };
        let stretch = Stretch {
            caller: op.signal,
            deadline: &op.deadline,
        };
        let (signal, bound) = if op.deadline.stretches() {
            let hard = op.deadline.grant_hard().unwrap_or(granted);
            (
                Some(&stretch as &dyn runwarden_vault::CancellationSignal),
                hard,
            )
        } else {
            (op.signal, granted)
        };
        let (requests, mut inbox) = tokio::sync::mpsc::unbounded_channel();
        let listen = spec.listen;
        let mut watch = Watch::new(
            id,
            Arc::default(),
            Some(requests),
            listen.and_then(|l| l.notices.clone()),
            listen.and_then(|l| l.on_progress.clone()),
        );
        let mut exit = process.exit();
        let until = tokio::time::Instant::now() + bound;
        let grace = self
            .server
            .stdio
            .as_ref()
            .map_or(Duration::ZERO, |s| s.cancel_grace);
        loop {
            tokio::select! {
                biased;
                answer = &mut pending.answer => {
                    // What the server sent before its answer is read first, in order.
                    while let Ok(event) = pending.events.try_recv() {
                        watch.message(event);
                    }
                    return match answer {
                        Ok(message) => Ok(Some(message)),
                        Err(_) => Err(self.ended_error(method, &mut exit).await),
                    };
                }
                Some(event) = pending.events.recv() => {
                    watch.message(event);
                }
                Some(request) = inbox.recv() => {
                    self.answer_locally(op, listen, request).await;
                }
                () = cancelled(signal) => {
                    process.abandoned(id, grace);
                    let error = EgressError::CancelledInFlight { host: self.server.url.clone() };
                    return Err(self.egress_error(op, method, error));
                }
                () = tokio::time::sleep_until(until) => {
                    process.abandoned(id, grace);
                    let problem = format!("no answer within the {} s budget", bound.as_secs());
                    return Err(self.local_error(method, problem, true));
                }
            }
        }
    }

    /// Answers one of the server's own requests that came during our request: through
    /// the call's elicitor when it has one, else as any request without a call is.
    async fn answer_locally(
        &self,
        op: &Operation<'_>,
        listen: Option<&Listen<'_>>,
        request: crate::stream::ServerRequest,
    ) {
        let Some(listen) = listen else {
            return;
        };
        let answer = self.answer_to(op, listen, request).await;
        self.send_answer(op, listen, answer).await;
    }

    /// The error of a request whose process ended before it answered: the request may
    /// have run.
    async fn ended_error(
        &self,
        method: &str,
        exit: &mut tokio::sync::watch::Receiver<Option<String>>,
    ) -> McpError {
        // The reader sees the pipe close a moment before the exit is known.
        let reason = tokio::time::timeout(Duration::from_secs(1), exit.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|r| r.clone()))
            .unwrap_or_else(|| "its stdout closed".to_string());
        let problem = format!("the server's process ended before it answered ({reason})");
        self.local_error(method, problem, true)
    }

    /// Refuses a message that carries the value of a stored secret: a local server gets
    /// only the secrets its configuration gives it, in its environment.
    async fn refuse_secrets(&self, method: &str, message: &Value) -> Result<(), McpError> {
        let redactor = self.egress.redactor().await.map_err(|e| {
            let problem = format!("the secrets to check it against could not be read ({e})");
            self.local_error(method, problem, false)
        })?;
        let carried = redactor.secrets_in(message);
        if carried.is_empty() {
            return Ok(());
        }
        let problem = format!(
            "it carries the value of stored secret {}, so it was not sent",
            carried.join(", ")
        );
        Err(self.local_error(method, problem, false))
    }

    pub(super) fn local_error(&self, method: &str, problem: String, sent: bool) -> McpError {
        McpError::Local {
            server: self.server.name.clone(),
            method: method.into(),
            problem,
            sent,
        }
    }

    /// The intent row of a local leg; its id, or why it could not be written.
    async fn local_row(
        &self,
        op: &Operation<'_>,
        action: &str,
        method: &str,
        ended: Option<(&Ended, i64)>,
        started: Instant,
    ) -> Result<i64, String> {
        let server = &self.server.name;
        let event = AuditEvent {
            time_ms: runwarden_base::now_ms(),
            action: action.to_string(),
            success: ended.is_some_and(|(e, _)| e.answered),
            secret: None,
            method: "STDIO".into(),
            host: format!("stdio:{server}"),
            path: method.to_string(),
            status: 0,
            duration_ms: started.elapsed().as_millis() as u64,
            error: ended.and_then(|(e, _)| e.error.clone()),
            reason: Some(if op.forced {
                format!("mcp {server} {method}, forced past the catalogue by the operator")
            } else {
                format!("mcp {server} {method}")
            }),
            actor: self.actor.clone(),
            correlation: op.correlation.clone(),
            intent_id: ended.map(|(_, intent)| intent),
        };
        self.egress
            .vault()
            .audit_record(event)
            .await
            .map(|row| row.id)
            .map_err(|e| format!("the audit log could not record it, so it was not sent ({e})"))
    }

    /// The completion row of a local leg; a failure to write it is logged, the leg's
    /// outcome stands.
    async fn local_done(
        &self,
        op: &Operation<'_>,
        method: &str,
        intent: i64,
        ended: &Ended,
        started: Instant,
    ) {
        let row = self
            .local_row(
                op,
                action::STDIO_CALL,
                method,
                Some((ended, intent)),
                started,
            )
            .await;
        if let Err(error) = row {
            tracing::warn!(server = %self.server.name, %error, "could not record the outcome of a message to a local server");
        }
    }
}

/// Resolves when `signal` says stop; never without one.
async fn cancelled(signal: Option<&dyn runwarden_vault::CancellationSignal>) {
    match signal {
        Some(signal) => until_cancelled(signal).await,
        None => std::future::pending().await,
    }
}

/// A local leg's answer in the shape of an HTTP one (no headers, no session id).
fn answer(message: Option<Value>, audit_id: Option<i64>) -> LegAnswer {
    LegAnswer {
        message,
        response: EgressResponse {
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
            truncated: false,
            audit_id,
        },
    }
}
