//! A response stream that broke before our answer, resumed with GET and `Last-Event-ID`;
//! the request itself is never sent again.

use std::time::Duration;

use runwarden_vault::{EgressError, Method};

use super::signal::until_cancelled;
use super::transport::{LegAnswer, LegSpec};
use super::{McpClient, Operation};
use crate::error::{McpError, one_line};

/// The most reconnections one request's stream gets (M16).
pub const MAX_RESUMES: usize = 3;

/// The longest the client waits before a reconnection, whatever `retry` the server asked.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// The wait before a reconnection when the server gave no `retry`.
const DEFAULT_RETRY_WAIT: Duration = Duration::from_millis(500);

impl McpClient {
    /// M16: sends a request whose answer may come in an event stream; when the stream
    /// ends before the answer and the server gave event ids, reconnects with GET and
    /// `Last-Event-ID` after the server's `retry`, at most [`MAX_RESUMES`] times, within
    /// the operation's budget and under its signal. The request is never sent again.
    pub(super) async fn resumable(
        &self,
        op: &Operation<'_>,
        spec: LegSpec<'_>,
    ) -> Result<LegAnswer, McpError> {
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
}
