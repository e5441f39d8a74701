//! The MCP client: one server, reached only through the vault's guarded egress client. The
//! connection is a 2026-07-28 stateless one after `server/discover`, or the `initialize`
//! handshake and its session; a signal enters in three places (a tool call, a request, a
//! notification). This file holds the client itself, its builders and the record of each
//! operation's outcome; the rest lives beside it, one concept per file:
//!
//! - `session`: the handshake, the session it keeps and its end;
//! - `stateless`: what the 2026-07-28 revision adds (the probe, `_meta`, mirrored headers,
//!   questions answered by re-issuing);
//! - `calls`: `tools/call` and its standalone stream;
//! - `requests`: every other request and the notifications;
//! - `transport`: one leg through the vault; `resume` reconnects a broken stream;
//!   `interpret` reads the answer; `listen` answers the server's own requests;
//! - `operation` and `signal`: the deadline, legs and signals one operation carries.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use runwarden_oauth::{AuthorizationPrompt, OAuthClient, OAuthError};
use runwarden_vault::{CancellationSignal, EgressClient};

use crate::catalogue::{CatalogueStore, Contact};
use crate::config::ServerConfig;
use crate::deadline::{Clock, Deadline, SystemClock};
use crate::error::{McpError, one_line};
use crate::stateless::{HeaderParam, HeaderRefusal};

mod calls;
mod interpret;
mod listen;
mod local;
mod operation;
mod requests;
mod resume;
mod session;
mod signal;
mod stateless;
mod transport;

pub use calls::{CallGate, GateFuture, McpCall, ToolCall};
pub use operation::{LegReport, RequestTrail};
pub use requests::{Notification, Reply, Request};
pub use resume::MAX_RESUMES;
pub use session::CLOSE_BUDGET;
pub use transport::USER_AGENT;

use operation::Operation;
use session::Session;

use runwarden_base::now_ms;

/// How often a client writes a server's successes to the store (M11), at most.
const SUCCESS_RECORDED_EVERY_MS: i64 = 1_000;
/// `success_recorded_ms` when no success is recorded since the last failure.
const NOT_RECORDED: i64 = i64::MIN;

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
    /// When this client last recorded a success that nothing has followed: a success
    /// within [`SUCCESS_RECORDED_EVERY_MS`] of it is not written again.
    success_recorded_ms: AtomicI64,
    /// M19: each listed tool's `x-mcp-header` parameters (or why they are refused), by
    /// remote name, learnt from `tools/list`.
    header_params:
        Mutex<std::collections::HashMap<String, Result<Vec<HeaderParam>, HeaderRefusal>>>,
    /// M18: the server's OAuth client, when it is configured for OAuth.
    oauth: Option<Arc<OAuthClient>>,
    /// How the last request operation went.
    last: Mutex<Option<RequestTrail>>,
    /// A local server's process, when the server is spoken to over stdio.
    local: Option<Arc<crate::stdio::LocalServer>>,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("server", &self.server.name)
            .finish_non_exhaustive()
    }
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
        let local = server.stdio.clone().map(|stdio| {
            Arc::new(crate::stdio::LocalServer::new(
                &server.name,
                stdio,
                egress.clone(),
                server.max_response_bytes,
            ))
        });
        Self {
            oauth,
            local,
            server,
            egress,
            clock: Arc::new(SystemClock::default()),
            session: tokio::sync::Mutex::new(None),
            next_id: AtomicI64::new(1),
            actor: "mcp".into(),
            health: None,
            success_recorded_ms: AtomicI64::new(NOT_RECORDED),
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

    /// What a failure of the OAuth client means for the leg that needed its token.
    pub(super) fn auth_error(&self, method: &str, error: OAuthError) -> McpError {
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

    /// Records each operation's outcome as the server's liveness (M11).
    pub fn with_health(mut self, store: Arc<dyn CatalogueStore>) -> Self {
        self.health = Some(store);
        self
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
            Ok(()) => {
                // M11: a busy server's successes are written at most once a second; the
                // time `mcp list` shows lags by less than that.
                let last = self.success_recorded_ms.load(Ordering::Relaxed);
                if last != NOT_RECORDED
                    && (0..SUCCESS_RECORDED_EVERY_MS).contains(&at_ms.saturating_sub(last))
                {
                    return;
                }
                self.success_recorded_ms.store(at_ms, Ordering::Relaxed);
                Contact::Success { at_ms }
            }
            Err(error) if error.is_cancelled() => return,
            Err(error) => {
                // A failure is always written, and the next success after it too.
                self.success_recorded_ms
                    .store(NOT_RECORDED, Ordering::Relaxed);
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

    /// The egress client its calls leave through (and whose vault keeps their audit rows).
    pub fn egress(&self) -> &Arc<EgressClient> {
        &self.egress
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
}
