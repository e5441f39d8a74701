//! The connection: the session a handshake negotiated (or what the store remembered of the
//! server), kept until [`McpClient::close`] ends it with `DELETE`.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, Implementation, InitializeRequestParams, InitializeResult, ProtocolVersion,
};
use runwarden_vault::Method;
use serde_json::{Value, json};

use super::transport::LegSpec;
use super::{McpClient, Operation, now_ms};
use crate::config::{ElicitationPolicy, ProtocolPolicy};
use crate::deadline::Deadline;
use crate::error::{McpError, one_line};
use crate::stateless::STATELESS_VERSION;
use crate::versions::{HANDSHAKE_VERSIONS, OLD_HTTP_SSE_VERSION};

/// The bound of the `DELETE` that ends a session when the client shuts down (M13).
pub const CLOSE_BUDGET: Duration = Duration::from_secs(2);

/// What the handshake negotiated.
#[derive(Debug)]
pub(super) struct Session {
    /// `Mcp-Session-Id`, only when the server issued one.
    pub(super) id: Option<String>,
    /// The negotiated version, sent as `MCP-Protocol-Version` on every later leg.
    pub(super) protocol: String,
    /// Whether the server offers tools.
    pub(super) tools: bool,
    /// M19: a 2026-07-28 connection: no session, `_meta` on every request, cancellation by
    /// closing the stream and no notifications.
    pub(super) stateless: bool,
    /// M19: taken from what the store remembered, not probed by this process.
    pub(super) remembered: bool,
    /// The run tag of the operation that opened the session, for its `DELETE`'s audit row.
    pub(super) correlation: Option<String>,
    /// The server answered a standalone GET with 405: it offers no standalone stream for
    /// this session, so none is asked for again.
    pub(super) no_standalone: AtomicBool,
    /// A local server's process the session was made with (0 over HTTP).
    pub(super) generation: u64,
}

impl McpClient {
    /// The negotiated session, running the handshake under this operation if there is none.
    pub(super) async fn session(&self, op: &Operation<'_>) -> Result<Arc<Session>, McpError> {
        let mut slot = self.session.lock().await;
        // A local server's session lives as long as the process it was made with.
        if let (Some(local), Some(session)) = (&self.local, slot.as_ref())
            && local.current(session.generation).is_none()
        {
            *slot = None;
        }
        let session = match slot.as_ref() {
            Some(session) => session.clone(),
            None => {
                // Boxed: a handshake is rare, and its state is large; inline, it would set
                // the size of every call's state (see `call_once`).
                let session = Arc::new(Box::pin(self.handshake(op)).await?);
                *slot = Some(session.clone());
                session
            }
        };
        *op.protocol.lock().unwrap_or_else(|p| p.into_inner()) = Some(session.protocol.clone());
        Ok(session)
    }

    /// Drops the session if it is still the one that expired.
    pub(super) async fn forget(&self, expired: &Arc<Session>) {
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
                    generation: 0,
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
            generation: self.local.as_ref().map_or(0, |l| l.generation()),
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

    /// M14: what the client declares it can do.
    pub(super) fn client_capabilities(&self) -> Value {
        let mut capabilities = match self.server.elicitation {
            ElicitationPolicy::Operator => json!({"elicitation": {"form": {}}}),
            ElicitationPolicy::Decline => json!({}),
        };
        if self.server.sampling {
            capabilities["sampling"] = json!({});
        }
        capabilities
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

    /// M13: ends the session with `DELETE`, bounded by [`CLOSE_BUDGET`] and with no signal
    /// (it runs when the process shuts down, after any cancel). A server that issued no
    /// session id has nothing to end; 404 (already gone) and 405 (the server does not let
    /// clients end sessions) count as ended. The next operation starts a new session.
    pub async fn close(&self) -> Result<(), McpError> {
        let session = self.session.lock().await.take();
        // A local server is stopped: stdin closed, then SIGTERM, then SIGKILL.
        if let Some(local) = &self.local {
            local.stop().await;
            return Ok(());
        }
        let Some(session) = session else {
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
}
