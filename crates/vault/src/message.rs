//! What an outbound call is and what came back, without any HTTP-library type: the
//! request a caller builds for the egress client and the response it hands back.

use std::time::Duration;

use crate::audit::action;
use crate::guard;
use crate::placement::Credential;

/// The default cap on a response body: 2 MiB (M5).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 2 * 1024 * 1024;

/// An HTTP method the egress client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

impl Method {
    /// The method as it goes on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }

    /// Parses a method name, case-insensitively.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::Get,
            Self::Head,
            Self::Post,
            Self::Put,
            Self::Patch,
            Self::Delete,
        ]
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(text))
    }

    pub(crate) fn to_reqwest(self) -> reqwest::Method {
        match self {
            Self::Get => reqwest::Method::GET,
            Self::Head => reqwest::Method::HEAD,
            Self::Post => reqwest::Method::POST,
            Self::Put => reqwest::Method::PUT,
            Self::Patch => reqwest::Method::PATCH,
            Self::Delete => reqwest::Method::DELETE,
        }
    }
}

/// Decides from the body read so far that the caller has what it needs, so the rest of
/// the stream is not waited for (an event stream that stays open after our answer).
pub type CompleteFn = Box<dyn FnMut(&[u8]) -> bool + Send>;

/// The caller's last check, run after the intent row is committed and right before the
/// transfer; an `Err` with the reason keeps the request unsent.
pub type BeforeTransfer = Box<
    dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        + Send,
>;

/// Told the id of the intent row once it is committed (the caller's record of which audit
/// row stands for its request, whatever the outcome).
pub type IntentObserver = Box<dyn FnOnce(i64) + Send>;

/// Told the HTTP status as soon as the response head arrives, before any body byte (a
/// caller that must know a long-lived stream is open before it sends something else).
pub type HeadObserver = Box<dyn FnOnce(u16) + Send>;

/// One outbound call, described without any HTTP-library type.
pub struct EgressRequest {
    pub(crate) method: Method,
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) credential: Option<Credential>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_response_bytes: usize,
    pub(crate) actor: String,
    pub(crate) correlation: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) complete_when: Option<CompleteFn>,
    pub(crate) before_transfer: Option<BeforeTransfer>,
    pub(crate) on_intent: Option<IntentObserver>,
    pub(crate) on_head: Option<HeadObserver>,
    /// Stored secrets the OAuth client sends in this request's body or
    /// headers on purpose (a client secret to its token endpoint).
    pub(crate) carries: Vec<String>,
    /// The action of the outcome row when the call reached the network (`http_call`
    /// unless the OAuth client names its requests).
    pub(crate) action: &'static str,
}

impl std::fmt::Debug for EgressRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressRequest")
            .field("method", &self.method)
            .field("host_and_path", &guard::describe_for_audit(&self.url))
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

impl EgressRequest {
    /// A request with no body, no credential and the client's default timeout.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: None,
            credential: None,
            timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            actor: "runwarden".into(),
            correlation: None,
            reason: None,
            complete_when: None,
            before_transfer: None,
            on_intent: None,
            on_head: None,
            carries: Vec::new(),
            action: action::HTTP_CALL,
        }
    }

    /// The audit action of the outcome row (the OAuth client's requests have their own).
    pub fn audit_action(mut self, action: &'static str) -> Self {
        self.action = action;
        self
    }

    /// Marks a stored secret as sent on purpose by the OAuth client (the client secret to
    /// the token endpoint the configuration names).
    pub fn carries_secret(mut self, name: &str) -> Self {
        self.carries.push(name.to_string());
        self
    }

    /// Adds a header. Values with CR or LF are refused at send time.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// Names the secret to place and where.
    pub fn credential(mut self, credential: Credential) -> Self {
        self.credential = Some(credential);
        self
    }

    /// The total bound for this request, connect included (V5).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Reads at most this many body bytes; the response says when it was cut.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// Who makes the call, for the audit row.
    pub fn actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = actor.into();
        self
    }

    /// The run id or other correlation, for the audit row.
    pub fn correlation(mut self, correlation: impl Into<String>) -> Self {
        self.correlation = Some(correlation.into());
        self
    }

    /// Why the call is made ("tools/call tickets__create"), for the audit row.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Runs `check` after the audit intent is committed and right before the first byte
    /// leaves: the narrowest point at which a caller can mark "this may now reach the
    /// server" (the runtime stamps its write fence here, R11). An `Err` keeps it unsent.
    pub fn before_transfer(mut self, check: BeforeTransfer) -> Self {
        self.before_transfer = Some(check);
        self
    }

    /// Calls `observe` with the id of the call's intent row (`http_call_started`) once it
    /// is committed; never called for a call that did not reach that point.
    pub fn on_intent(mut self, observe: IntentObserver) -> Self {
        self.on_intent = Some(observe);
        self
    }

    /// Calls `observe` with the status once the response head arrived; never called for
    /// a call that got no answer.
    pub fn on_head(mut self, observe: HeadObserver) -> Self {
        self.on_head = Some(observe);
        self
    }

    /// Stops reading the body once `complete` answers true for what was read so far.
    pub fn complete_when(mut self, complete: CompleteFn) -> Self {
        self.complete_when = Some(complete);
        self
    }
}

/// What came back. Any status but 3xx arrives here; the caller decides what is failure.
#[derive(Debug, Clone)]
pub struct EgressResponse {
    /// The HTTP status.
    pub status: u16,
    /// Response headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body, at most the request's limit.
    pub body: Vec<u8>,
    /// True when the body was longer than the limit and the rest was not read.
    pub truncated: bool,
    /// The id of the audit row this call wrote, when the write succeeded.
    pub audit_id: Option<i64>,
}

impl EgressResponse {
    /// The first value of a header, by lowercase name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// True for a 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}
