//! The MCP client's error type: every failure names the server and the method.

use std::time::Duration;

use runwarden_vault::{Delivery, EgressError};

/// Why an MCP operation failed (M5). Never carries a response body's bytes beyond a short,
/// single-line excerpt of a JSON-RPC error message the server wrote.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// M3: less than a second of the operation's budget was left, so the leg was not sent.
    #[error("{method} to server {server} not sent: the {} s budget for this operation is spent", budget.as_secs())]
    NotSent {
        /// The server.
        server: String,
        /// The leg that was not sent.
        method: String,
        /// The operation's whole budget.
        budget: Duration,
    },
    /// M4: the caller's signal cancelled the leg.
    #[error("{method} to server {server} cancelled {}", if *in_flight { "in flight; the connection was dropped" } else { "before send; nothing was sent" })]
    Cancelled {
        /// The server.
        server: String,
        /// The leg that was cancelled.
        method: String,
        /// True when the request had gone out (its effect is unknown).
        in_flight: bool,
    },
    /// The vault refused or could not complete the leg (policy, credential, timeout, transport).
    #[error("{method} to server {server}: {source}")]
    Egress {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// What the vault said (boxed: it is large and this path is rare).
        #[source]
        source: Box<EgressError>,
    },
    /// The server answered with an HTTP status that is not success.
    #[error("server {server} answered HTTP {status} to {method}{}", match status {
        401 | 403 => "; it refused the credential, which is not sent again: check the server's auth in the configuration",
        _ => "",
    })]
    Status {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// The status.
        status: u16,
    },
    /// M5: 404 on a request that carried a session id: the server forgot the session.
    #[error("server {server} no longer knows our session (HTTP 404 to {method}){}", if method == "tools/call" { "; the call was not re-sent because it may have run" } else { "" })]
    SessionExpired {
        /// The server.
        server: String,
        /// The leg.
        method: String,
    },
    /// M5: the body was larger than the server's `max_response_bytes`; it was read up to
    /// the limit and refused, and none of it is echoed.
    #[error(
        "server {server} answered {method} with {}, over its max_response_bytes of {limit} bytes; the answer was refused{}: raise max_response_bytes in [mcp.servers.{server}] to accept answers this large",
        match size { Some(size) => format!("{size} bytes"), None => format!("more than {limit} bytes") },
        if *complete { " (the server had finished the request)" } else { "" }
    )]
    TooLarge {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// The limit in bytes.
        limit: usize,
        /// The answer's size, when the server declared it (`Content-Length`).
        size: Option<u64>,
        /// True when the server had finished the request: its answer (a JSON body, or the
        /// response event of a stream) had begun, so a write took effect.
        complete: bool,
    },
    /// M5: an HTML page instead of JSON-RPC, usually a wrong URL or a login page.
    #[error(
        "server {server} answered {method} with an HTML page, not JSON-RPC: check the server's url"
    )]
    Html {
        /// The server.
        server: String,
        /// The leg.
        method: String,
    },
    /// M5: a content type that is neither JSON nor an event stream.
    #[error("server {server} answered {method} with unsupported content type {content_type:?}")]
    ContentType {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// The content type as sent (cut to 60 characters).
        content_type: String,
    },
    /// M5: an empty body where a JSON-RPC response was due.
    #[error("server {server} answered {method} with an empty body")]
    EmptyBody {
        /// The server.
        server: String,
        /// The leg.
        method: String,
    },
    /// M1: an event stream that ended without the response to our request.
    #[error("server {server} closed the event stream for {method} without answering it")]
    NoResponse {
        /// The server.
        server: String,
        /// The leg.
        method: String,
    },
    /// M5: the body is not a JSON-RPC response (not JSON, or neither result nor error).
    #[error("server {server} answered {method} with a malformed response: {problem}")]
    Malformed {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// What is wrong, in our words.
        problem: String,
    },
    /// M5: the server answered with a JSON-RPC error (in a success, or in the body of an
    /// HTTP error status).
    #[error("server {server} refused {method}{}: JSON-RPC error {code}: {message}", status.map(|s| format!(" with HTTP {s}")).unwrap_or_default())]
    Rpc {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// The HTTP status the error came with, when it was not a success.
        status: Option<u16>,
        /// The JSON-RPC error code.
        code: i64,
        /// The server's message, one line, at most 200 characters.
        message: String,
    },
    /// M2: version or capability negotiation failed.
    #[error("server {server}: {problem}")]
    Protocol {
        /// The server.
        server: String,
        /// What failed.
        problem: String,
    },
    /// The server declares no `tools` capability (in its initialize or `server/discover`
    /// result): it has nothing to list or call.
    #[error(
        "server {server} offers no tools (its {via} result at protocol {protocol} has no tools capability)"
    )]
    NoTools {
        /// The server.
        server: String,
        /// The protocol version spoken.
        protocol: String,
        /// Where the capabilities came from: `initialize` or `server/discover`.
        via: &'static str,
    },
    /// A local (stdio) server could not take the message: its process could not start,
    /// has ended, did not read it, or did not answer in time.
    #[error("{method} to local server {server}: {problem}")]
    Local {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// What went wrong, in words a person reads.
        problem: String,
        /// True when the message (or part of it) reached the server.
        sent: bool,
    },
    /// The caller's gate refused the call after the session was ready; `tools/call` was
    /// not sent (the runtime's write fence could not be stamped, R7).
    #[error("tools/call to server {server} not sent: {reason}")]
    Gated {
        /// The server.
        server: String,
        /// Why the gate refused, in the caller's words.
        reason: String,
    },
    /// M15: with `progress_extends_deadline`, the server sent no progress for a whole
    /// budget (or the hard maximum passed), so the client stopped waiting.
    #[error("{method} to server {server} stopped: no answer and no progress within the {} s budget", budget.as_secs())]
    Stalled {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// The operation's budget (restarted by each progress notification).
        budget: Duration,
    },
    /// M16: the response stream ended before our response and could not be resumed; the
    /// request may have run (a `tools/call` is never re-sent).
    #[error(
        "server {server} ended the event stream for {method} early and it could not be resumed after {attempts} attempt(s): {cause}"
    )]
    ResumeFailed {
        /// The server.
        server: String,
        /// The request whose answer was lost.
        method: String,
        /// Resumption attempts made (GET with `Last-Event-ID`).
        attempts: usize,
        /// Why the last attempt failed, one line.
        cause: String,
    },
    /// M19: the server refused the protocol version we asked for (JSON-RPC -32022) and
    /// serves none runwarden speaks.
    #[error(
        "server {server} refused {method}: it serves protocol version(s) {}, none of which runwarden speaks ({})",
        if supported.is_empty() { "(none named)".to_string() } else { supported.join(", ") },
        crate::versions::SUPPORTED_VERSIONS.join(", ")
    )]
    UnsupportedVersion {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// The versions it named, each cut to one short line.
        supported: Vec<String>,
    },
    /// M19: the tool declares `x-mcp-header` parameters the spec forbids, so it is refused
    /// (at import, and at call time if it was imported before); nothing was sent.
    #[error(
        "tool {tool} of server {server} is refused: {problem}; the server must fix its x-mcp-header declarations"
    )]
    ToolHeaders {
        /// The server.
        server: String,
        /// The remote tool name.
        tool: String,
        /// What is wrong.
        problem: String,
    },
    /// M19: an argument mirrored into an `Mcp-Param-*` header cannot be a header value;
    /// `tools/call` was not sent.
    #[error("tools/call {tool} to server {server} not sent: {problem}")]
    HeaderValue {
        /// The server.
        server: String,
        /// The remote tool name.
        tool: String,
        /// What is wrong, naming the argument.
        problem: String,
    },
    /// M19: the server asked for input runwarden cannot give (not an elicitation, several
    /// questions at once while parking, or more rounds than the ceiling).
    #[error("tools/call {tool} to server {server} stopped: {problem}")]
    InputRefused {
        /// The server.
        server: String,
        /// The remote tool name.
        tool: String,
        /// What was asked and why it is not answered.
        problem: String,
    },
    /// M18: the server asked for OAuth and no token could be had (discovery, a grant, a
    /// renewal or a step-up failed), or it refused a fresh token. Nothing of the request
    /// ran: a 401 or 403 is the server's refusal before it dispatches it.
    #[error("{method} to server {server}: {source}")]
    Auth {
        /// The server.
        server: String,
        /// The leg.
        method: String,
        /// What the OAuth client said.
        #[source]
        source: Box<runwarden_oauth::OAuthError>,
    },
    /// M6: discovery did not end within the page ceiling.
    #[error("server {server} kept paginating tools/list past {pages} pages; discovery was stopped")]
    TooManyPages {
        /// The server.
        server: String,
        /// The ceiling.
        pages: usize,
    },
}

impl McpError {
    /// V8: how far the leg that failed got. A failure the vault reported keeps the
    /// vault's answer. A 2xx whose body holds no usable response to our request (an event
    /// stream that ended early, an empty or malformed body, one cut at the limit) may
    /// have been acted on, so it is `maybe_delivered`; only a JSON-RPC error or an HTTP
    /// error status counts as the server's answer.
    pub fn delivery(&self) -> Delivery {
        match self {
            Self::NotSent { .. }
            | Self::Gated { .. }
            | Self::NoTools { .. }
            | Self::ToolHeaders { .. }
            | Self::HeaderValue { .. } => Delivery::NotSent,
            // M18: refused before dispatch (401/403), or never sent for want of a token.
            Self::Auth { .. } => Delivery::NotSent,
            Self::Cancelled { in_flight, .. } => {
                if *in_flight {
                    Delivery::MaybeDelivered
                } else {
                    Delivery::NotSent
                }
            }
            Self::Egress { source, .. } => source.delivery(),
            Self::Local { sent, .. } => {
                if *sent {
                    Delivery::MaybeDelivered
                } else {
                    Delivery::NotSent
                }
            }
            // M5: an answer too large to keep is still the server's answer.
            Self::TooLarge { complete: true, .. } => Delivery::Answered,
            Self::Status { .. }
            | Self::SessionExpired { .. }
            | Self::Rpc { .. }
            | Self::UnsupportedVersion { .. }
            | Self::InputRefused { .. } => Delivery::Answered,
            Self::TooLarge { .. }
            | Self::Html { .. }
            | Self::ContentType { .. }
            | Self::EmptyBody { .. }
            | Self::NoResponse { .. }
            | Self::Malformed { .. }
            | Self::Protocol { .. }
            | Self::Stalled { .. }
            | Self::ResumeFailed { .. }
            | Self::TooManyPages { .. } => Delivery::MaybeDelivered,
        }
    }

    /// True for a cancellation, before send or in flight.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }

    /// True when the call was refused, unsent, because this side's store failed: the
    /// audit row announcing it could not be written, or the vault could not read its
    /// records. It says nothing about the tool, so the caller retries the step later
    /// instead of passing it on as the tool's answer.
    pub fn is_store_fault(&self) -> bool {
        matches!(self, Self::Egress { source, .. }
            if matches!(**source, EgressError::AuditUnavailable { .. } | EgressError::Store(_)))
    }
}

pub(crate) use runwarden_base::one_line;
