//! The guarded egress client: one audited, cancellable, bounded HTTP call at a time.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderName, HeaderValue};
use tracing::Instrument as _;

use crate::audit::{AuditEvent, action, audit_error_text};
use crate::delivery::Delivery;
use crate::dpop::{self, DpopKey};
use crate::error::EgressError;
use crate::exfiltration::carried_secrets;
use crate::guard::{self, EgressPolicy, VettedTarget};
use crate::placement::{Credential, Placed, Placement};
use crate::resolver::{Resolver, SystemResolver};
use crate::scrub::{Scrubber, StreamScrub};
use crate::secret::SecretValue;
use crate::signal::CancellationSignal;
use crate::vault::{Vault, now_ms};

/// The default cap on a response body: 2 MiB (M5).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 2 * 1024 * 1024;

/// The longest the vault waits between two questions to a signal that cannot wake while a
/// call is in flight (V6).
pub const MAX_TICK: Duration = Duration::from_millis(100);

/// The default backstop tick for a signal that wakes ([`CancellationSignal::wakes`]): news
/// arrives by the wake-up (the runtime's status watcher also wakes its calls after each
/// periodic refresh that finds a cancel), and this slow poll only covers a wake-up that
/// never came. Idle calls cost one timer wake-up each per tick: at 10,000 idle calls a 1 s
/// tick measured 8.4-8.8 % of a core, 5 s 3.4 % (BENCHMARKS.md, `inflight`).
pub const DEFAULT_BACKSTOP_TICK: Duration = Duration::from_secs(5);

/// The longest backstop tick the client accepts.
pub const MAX_BACKSTOP_TICK: Duration = Duration::from_secs(5);

/// The grace the wall-clock backstop adds on top of the connect and total timeouts.
const BACKSTOP_GRACE: Duration = Duration::from_secs(5);

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

    fn to_reqwest(self) -> reqwest::Method {
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
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    credential: Option<Credential>,
    timeout: Option<Duration>,
    max_response_bytes: usize,
    actor: String,
    correlation: Option<String>,
    reason: Option<String>,
    complete_when: Option<CompleteFn>,
    before_transfer: Option<BeforeTransfer>,
    on_intent: Option<IntentObserver>,
    on_head: Option<HeadObserver>,
    /// Stored secrets the vault's own OAuth client sends in this request's body or
    /// headers on purpose (a client secret to its token endpoint).
    carries: Vec<String>,
    /// The action of the outcome row when the call reached the network (`http_call`
    /// unless the vault's own OAuth client names its requests).
    action: &'static str,
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

/// Settings of an [`EgressClient`].
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Which private targets the operator admits.
    pub policy: EgressPolicy,
    /// The bound on opening a connection.
    pub connect_timeout: Duration,
    /// The total bound of a request that sets none.
    pub default_timeout: Duration,
    /// How often a signal that cannot wake is asked while a call is in flight; at most
    /// [`MAX_TICK`].
    pub tick: Duration,
    /// How often a signal that wakes is asked besides its wake-ups; at least `tick`, at
    /// most [`MAX_BACKSTOP_TICK`]. Idle in-flight calls cost one timer wake-up each per
    /// backstop tick, so this is what 10,000 idle calls cost.
    pub backstop_tick: Duration,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            policy: EgressPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            default_timeout: Duration::from_secs(30),
            tick: MAX_TICK,
            backstop_tick: DEFAULT_BACKSTOP_TICK,
        }
    }
}

/// Addresses the guard vetted, by host; the only answers reqwest's connector gets.
type PinTable = Arc<RwLock<HashMap<String, Vec<IpAddr>>>>;

/// reqwest's resolver: answers only from the pin table, never from DNS (V4: no second
/// lookup, so a rebinding name cannot swap the address between check and connect).
struct PinnedResolver {
    pins: PinTable,
}

impl Resolve for PinnedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let found = self
            .pins
            .read()
            .ok()
            .and_then(|pins| pins.get(name.as_str()).cloned());
        Box::pin(async move {
            match found {
                Some(ips) => {
                    Ok(Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0))) as Addrs)
                }
                None => Err("the host was not vetted by the egress guard".into()),
            }
        })
    }
}

/// The only HTTP client in runwarden: places credentials, enforces the egress policy,
/// bounds and cancels transfers, and audits every call: an intent row committed before
/// any byte leaves, and an outcome row (V3-V7).
pub struct EgressClient {
    vault: Arc<Vault>,
    config: EgressConfig,
    resolver: Arc<dyn Resolver>,
    http: reqwest::Client,
    pins: PinTable,
    observer: Option<CallObserver>,
}

/// Told each outbound call's audit action and delivery fact as it ends (O5: the process's
/// own call counters). Never told a URL, a header or a secret.
pub type CallObserver = Arc<dyn Fn(&str, Delivery) + Send + Sync>;

impl std::fmt::Debug for EgressClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressClient")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a signal answered.
enum Answer {
    Go,
    Stop,
    Panicked,
}

fn ask(signal: &dyn CancellationSignal) -> Answer {
    match std::panic::catch_unwind(AssertUnwindSafe(|| signal.is_cancelled())) {
        Ok(false) => Answer::Go,
        Ok(true) => Answer::Stop,
        Err(_) => Answer::Panicked,
    }
}

/// A finished transfer.
struct Transfer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    truncated: bool,
    location: Option<String>,
}

/// How driving a transfer ended.
enum Driven {
    Done(Result<Transfer, reqwest::Error>),
    Cancelled,
    SignalPanicked,
    Backstop,
}

/// The fields of an audit row that are known before the outcome.
struct CallRecord {
    started: Instant,
    time_ms: i64,
    method: Method,
    host: String,
    path: String,
    secret: Option<String>,
    actor: String,
    correlation: Option<String>,
    reason: Option<String>,
    /// The intent row written before the transfer, which the completion row names.
    intent_id: Option<i64>,
}

impl CallRecord {
    fn event(
        &self,
        action: &str,
        status: u16,
        error: Option<&EgressError>,
        scrubber: &Scrubber,
    ) -> AuditEvent {
        AuditEvent {
            time_ms: self.time_ms,
            action: action.to_string(),
            success: error.is_none() && (200..300).contains(&status),
            secret: self.secret.clone(),
            method: self.method.as_str().to_string(),
            host: self.host.clone(),
            path: self.path.clone(),
            status,
            duration_ms: self.started.elapsed().as_millis() as u64,
            // V9: scrubbed before the text is cut to length, so a cut never leaves a
            // recognisable part of a form behind.
            error: error.map(|e| audit_error_text(&scrubber.text(&e.to_string()))),
            reason: self.reason.clone(),
            actor: self.actor.clone(),
            correlation: self.correlation.clone(),
            intent_id: self.intent_id,
        }
    }
}

/// A redirect target as errors show it: host and path, never the query (V7);
/// `(no location)` when nothing readable is left.
pub(crate) fn describe_location(raw: &str) -> String {
    let (host, path) = guard::describe_for_audit(raw);
    match (host.is_empty(), path.is_empty()) {
        (true, true) => "(no location)".into(),
        (true, false) => path,
        (false, _) => format!("{host}{path}"),
    }
}

/// One line describing a reqwest error without its URL (which may carry a query secret).
fn describe_reqwest(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    audit_error_text(&text)
}

impl EgressClient {
    /// A client over `vault` using the system resolver.
    pub fn new(vault: Arc<Vault>, config: EgressConfig) -> Self {
        Self::with_resolver(vault, config, Arc::new(SystemResolver))
    }

    /// A client with its own resolver (tests serve hostile DNS answers through this).
    pub fn with_resolver(
        vault: Arc<Vault>,
        mut config: EgressConfig,
        resolver: Arc<dyn Resolver>,
    ) -> Self {
        config.tick = config.tick.clamp(Duration::from_millis(1), MAX_TICK);
        config.backstop_tick = config.backstop_tick.clamp(config.tick, MAX_BACKSTOP_TICK);
        let pins: PinTable = Arc::default();
        let http = reqwest::Client::builder()
            .no_proxy() // V4: never a proxy from the environment
            .redirect(reqwest::redirect::Policy::none()) // V4: a 3xx is returned, never chased
            .connect_timeout(config.connect_timeout)
            .dns_resolver(Arc::new(PinnedResolver { pins: pins.clone() }))
            .build()
            .expect("a client with a static configuration always builds");
        Self {
            vault,
            config,
            resolver,
            http,
            pins,
            observer: None,
        }
    }

    /// Tells `observer` each call's audit action and delivery as it ends (O5 metrics).
    pub fn with_observer(mut self, observer: CallObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The vault behind this client.
    pub fn vault(&self) -> &Arc<Vault> {
        &self.vault
    }

    /// Sends one request and audits it, whatever happens (V7): a call that reaches the
    /// network writes an intent row (`http_call_started`) before the transfer and a
    /// completion row naming it after; a call that never does writes exactly one row. If
    /// the intent cannot be committed, nothing is sent ([`EgressError::AuditUnavailable`]).
    ///
    /// With a signal: asked before anything that costs (a true answer reads no secret and
    /// sends nothing), then at least every tick and whenever it wakes the client while the
    /// transfer is in flight (a true answer drops the connection at once).
    pub async fn send(
        &self,
        request: EgressRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<EgressResponse, EgressError> {
        // O5: one span per outbound call, named by what the audit row names (never the
        // query, never a header), with the delivery fact once it is known.
        let (host, _) = guard::describe_for_audit(&request.url);
        let span = tracing::info_span!(
            "outbound_call",
            http.request.method = request.method.as_str(),
            server.address = %host,
            actor = request.actor.as_str(),
            delivery = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
        );
        let result = self
            .send_in_span(request, signal)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(response) => {
                span.record("delivery", Delivery::Answered.as_str());
                span.record("http.response.status_code", response.status);
            }
            Err(error) => {
                span.record("delivery", error.delivery().as_str());
            }
        }
        result
    }

    async fn send_in_span(
        &self,
        request: EgressRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<EgressResponse, EgressError> {
        let (host, path) = guard::describe_for_audit(&request.url);
        let mut record = CallRecord {
            started: Instant::now(),
            time_ms: now_ms(),
            method: request.method,
            host,
            path,
            secret: request.credential.as_ref().map(|c| c.secret.to_string()),
            actor: request.actor.clone(),
            correlation: request.correlation.clone(),
            reason: request.reason.clone(),
            intent_id: None,
        };

        // V6: the first question comes before the guard, the secret and the socket.
        if let Some(signal) = signal {
            match ask(signal) {
                Answer::Go => {}
                Answer::Stop => {
                    let error = EgressError::CancelledBeforeSend;
                    return self
                        .finish(
                            &record,
                            action::HTTP_CALL_CANCELLED_BEFORE_SEND,
                            0,
                            Err(error),
                            &Scrubber::none(),
                        )
                        .await;
                }
                Answer::Panicked => {
                    let error = EgressError::SignalPanicked {
                        host: record.host.clone(),
                        delivery: Delivery::NotSent,
                    };
                    return self
                        .finish(
                            &record,
                            action::HTTP_CALL_REFUSED,
                            0,
                            Err(error),
                            &Scrubber::none(),
                        )
                        .await;
                }
            }
        }

        // V4: the guard decides before any secret is read.
        let target =
            match guard::vet_target(&self.config.policy, &*self.resolver, &request.url).await {
                Ok(target) => target,
                Err(refusal) => {
                    return self
                        .finish(
                            &record,
                            action::HTTP_CALL_REFUSED,
                            0,
                            Err(refusal.into()),
                            &Scrubber::none(),
                        )
                        .await;
                }
            };
        record.host = target.audit_host();
        record.path = target.url.path().to_string();

        let (secret, dpop_key) = match &request.credential {
            None => (None, None),
            Some(credential) => match self.read_credential(credential).await {
                Ok((value, key)) => (Some(value), key),
                Err(e) => {
                    return self
                        .finish(
                            &record,
                            action::HTTP_CALL_REFUSED,
                            0,
                            Err(EgressError::Credential(e)),
                            &Scrubber::none(),
                        )
                        .await;
                }
            },
        };
        // What comes back is searched for every stored secret and the one placed here.
        let matcher = match self.vault.secret_matcher().await {
            Ok(matcher) => matcher,
            Err(e) => {
                return self
                    .finish(
                        &record,
                        action::HTTP_CALL_REFUSED,
                        0,
                        Err(EgressError::Store(e)),
                        &Scrubber::none(),
                    )
                    .await;
            }
        };
        let placed = request
            .credential
            .as_ref()
            .map(|c| c.secret.as_str())
            .zip(secret.as_ref());
        let scrubber = Scrubber::new(Some(matcher), placed);
        // No secret leaves for a host it does not belong to: checked before the intent
        // row, so a refused request sends nothing and writes one row naming the secret.
        let carried = carried_secrets(
            &scrubber,
            &request.url,
            &request.headers,
            request.body.as_deref(),
            &request.carries,
        );
        if !carried.is_empty() {
            tracing::warn!(host = %record.host, secrets = ?carried, "refused a request carrying a secret's value (secret_exfiltration)");
            record.reason = Some("secret_exfiltration".into());
            record.secret = Some(carried.join(","));
            let error = EgressError::SecretExfiltration {
                host: record.host.clone(),
                secrets: carried,
            };
            return self
                .finish(&record, action::HTTP_CALL_REFUSED, 0, Err(error), &scrubber)
                .await;
        }
        let answered = request.action;
        let built = self.build(&request, &target, secret.as_ref(), dpop_key.as_ref());
        let http_request = match built {
            Ok(r) => r,
            Err(error) => {
                return self
                    .finish(&record, action::HTTP_CALL_REFUSED, 0, Err(error), &scrubber)
                    .await;
            }
        };

        // V7 (amended): no egress without an audit row. The intent is committed before any
        // byte goes out; if it cannot be, nothing is sent.
        let intent = record.event(action::HTTP_CALL_STARTED, 0, None, &scrubber);
        match self.vault.audit_record(intent).await {
            Ok(row) => {
                record.intent_id = Some(row.id);
                if let Some(observe) = request.on_intent {
                    observe(row.id);
                }
            }
            Err(e) => {
                let detail = audit_error_text(&scrubber.text(&e.to_string()));
                record.reason = Some("audit_unavailable".into());
                return self
                    .finish(
                        &record,
                        action::HTTP_CALL_REFUSED,
                        0,
                        Err(EgressError::AuditUnavailable { detail }),
                        &scrubber,
                    )
                    .await;
            }
        }

        if let Some(check) = request.before_transfer
            && let Err(reason) = check().await
        {
            return self
                .finish(
                    &record,
                    action::HTTP_CALL_REFUSED,
                    0,
                    Err(EgressError::Held { reason }),
                    &scrubber,
                )
                .await;
        }

        let timeout = request.timeout.unwrap_or(self.config.default_timeout);
        let backstop = timeout + self.config.connect_timeout + BACKSTOP_GRACE;
        // V9: the caller's hook reads the body while it arrives (an MCP client hands the
        // server's progress and log messages on from it), so it sees it scrubbed too.
        // The body grows a chunk at a time: the scrub keeps what it cleaned up to the last
        // line break and looks again only at what came after (a line never splits an
        // escape, so no spelling of a secret is cut in two by the window).
        let complete_when = request.complete_when.map(|mut complete| {
            let mut stream = StreamScrub::new(scrubber.clone());
            Box::new(move |body: &[u8]| complete(&stream.view(body))) as CompleteFn
        });
        let transfer = transfer(
            self.http.clone(),
            http_request,
            request.max_response_bytes,
            complete_when,
            request.on_head,
        );
        let driven = self.drive(transfer, signal, backstop).await;

        let host = record.host.clone();
        match driven {
            Driven::Done(Ok(t)) if (300..400).contains(&t.status) => {
                let location = t.location.unwrap_or_else(|| "(no location)".into());
                let error = EgressError::Redirect {
                    host,
                    status: t.status,
                    location,
                };
                self.finish(&record, answered, t.status, Err(error), &scrubber)
                    .await
            }
            Driven::Done(Ok(t)) => {
                tracing::debug!(host = %record.host, status = t.status, reason = ?record.reason, "outbound call answered");
                if dpop_key.is_some()
                    && let Some((_, nonce)) = t.headers.iter().find(|(n, _)| n == "dpop-nonce")
                {
                    self.vault.dpop_nonces.remember(&target.url, nonce);
                }
                let response = EgressResponse {
                    status: t.status,
                    headers: t.headers,
                    body: t.body,
                    truncated: t.truncated,
                    audit_id: None,
                };
                self.finish(&record, answered, t.status, Ok(response), &scrubber)
                    .await
            }
            Driven::Done(Err(e)) => {
                // V8: only a failure to connect proves that no request byte left; a timeout
                // or a reset after that may have reached the server.
                let delivery = if e.is_connect() {
                    Delivery::NotSent
                } else {
                    Delivery::MaybeDelivered
                };
                let error = if e.is_timeout() {
                    EgressError::Timeout {
                        host,
                        after: timeout,
                        delivery,
                    }
                } else {
                    EgressError::Transport {
                        host,
                        detail: describe_reqwest(e),
                        delivery,
                    }
                };
                self.finish(&record, answered, 0, Err(error), &scrubber)
                    .await
            }
            Driven::Cancelled => {
                let error = EgressError::CancelledInFlight { host };
                self.finish(
                    &record,
                    action::HTTP_CALL_CANCELLED,
                    0,
                    Err(error),
                    &scrubber,
                )
                .await
            }
            Driven::SignalPanicked => {
                let error = EgressError::SignalPanicked {
                    host,
                    delivery: Delivery::MaybeDelivered,
                };
                self.finish(&record, answered, 0, Err(error), &scrubber)
                    .await
            }
            Driven::Backstop => {
                let error = EgressError::Backstop {
                    host,
                    after: backstop,
                };
                self.finish(&record, answered, 0, Err(error), &scrubber)
                    .await
            }
        }
    }

    /// Reads what a credential places: a stored secret, or the access token of an OAuth
    /// grant the vault holds (M18) with the DPoP key it is bound to.
    async fn read_credential(
        &self,
        credential: &Credential,
    ) -> Result<(SecretValue, Option<DpopKey>), crate::error::VaultError> {
        match credential.placement {
            Placement::OAuth => self.vault.oauth_access_use(&credential.secret).await,
            _ => Ok((self.vault.secret_use(&credential.secret).await?, None)),
        }
    }

    /// Builds the wire request: the caller's headers, the placed credential (with its
    /// DPoP proof when the token is bound), the pinned addresses, the total timeout.
    fn build(
        &self,
        request: &EgressRequest,
        target: &VettedTarget,
        secret: Option<&SecretValue>,
        dpop_key: Option<&DpopKey>,
    ) -> Result<reqwest::Request, EgressError> {
        let mut url = target.url.clone();
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in &request.headers {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                EgressError::InvalidHeader {
                    name: name.clone(),
                    problem: "not a valid header name",
                }
            })?;
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(EgressError::InvalidHeader {
                    name: name.clone(),
                    problem: "the value contains a line break",
                });
            }
            let value = HeaderValue::from_str(value).map_err(|_| EgressError::InvalidHeader {
                name: name.clone(),
                problem: "not a valid header value",
            })?;
            headers.append(header, value);
        }
        // O5: the server's spans join the run's trace (only when traces are exported).
        if let Some(traceparent) = crate::trace::traceparent()
            && let Ok(value) = HeaderValue::from_str(&traceparent)
        {
            headers.insert(HeaderName::from_static("traceparent"), value);
        }
        if let (Some(credential), Some(secret)) = (&request.credential, secret) {
            match credential.placement.place(secret)? {
                Placed::Header(name, value) => {
                    headers.insert(name, value);
                }
                Placed::Query(name, value) => {
                    url.query_pairs_mut().append_pair(&name, &value);
                }
            }
            // RFC 9449: a bound token goes with a fresh proof of its key for this request.
            if let Some(key) = dpop_key {
                let nonce = self.vault.dpop_nonces.get(&target.url);
                let placed = dpop::wire_headers(
                    key,
                    request.method.as_str(),
                    &target.url,
                    secret,
                    nonce.as_deref(),
                )?;
                for (name, value) in placed {
                    headers.insert(name, value);
                }
            }
        }
        if !target.ip_literal {
            let key = target.url.host_str().unwrap_or_default().to_string();
            if let Ok(mut pins) = self.pins.write() {
                pins.insert(key, target.addrs.clone());
            }
        }
        let timeout = request
            .timeout
            .unwrap_or(self.config.default_timeout)
            .max(Duration::from_millis(1));
        let mut builder = self
            .http
            .request(request.method.to_reqwest(), url)
            .headers(headers)
            .timeout(timeout);
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        builder.build().map_err(|e| EgressError::Transport {
            host: target.host.clone(),
            detail: describe_reqwest(e),
            delivery: Delivery::NotSent,
        })
    }

    /// Drives a transfer while asking the signal; dropping the transfer closes its socket.
    async fn drive(
        &self,
        transfer: impl std::future::Future<Output = Result<Transfer, reqwest::Error>>,
        signal: Option<&dyn CancellationSignal>,
        backstop: Duration,
    ) -> Driven {
        let transfer = std::pin::pin!(transfer);
        let mut transfer = transfer;
        let deadline = tokio::time::sleep(backstop);
        let mut deadline = std::pin::pin!(deadline);
        let Some(signal) = signal else {
            return tokio::select! {
                result = &mut transfer => Driven::Done(result),
                _ = &mut deadline => Driven::Backstop,
            };
        };
        // V6: a signal that cannot wake is polled every tick (100 ms at most); one that
        // wakes is asked when woken, and the slow backstop tick only covers a lost wake-up.
        let period = if signal.wakes() {
            self.config.backstop_tick
        } else {
            self.config.tick
        };
        let start = tokio::time::Instant::now() + period;
        let mut tick = tokio::time::interval_at(start, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut wake = signal.woken();
        // A change between the pre-flight question and the line above woke no future: the
        // first pass asks once, right after the transfer was first polled, so that change
        // is not left to the backstop.
        let mut first = signal.wakes();
        loop {
            let woken = tokio::select! {
                biased;
                result = &mut transfer => return Driven::Done(result),
                _ = &mut deadline => return Driven::Backstop,
                _ = std::future::ready(()), if first => false,
                _ = &mut wake => true,
                _ = tick.tick() => false,
            };
            first = false;
            if woken {
                wake = signal.woken();
                tracing::debug!("woken");
            }
            match ask(signal) {
                Answer::Go => {}
                Answer::Stop => {
                    // O5: the cancel as an event of the call's span, then the teardown.
                    tracing::info!(woken, "cancel observed; tearing the connection down");
                    return Driven::Cancelled;
                }
                Answer::Panicked => return Driven::SignalPanicked,
            }
        }
    }

    /// Writes the audit row and hands back the outcome with the row's id.
    async fn finish(
        &self,
        record: &CallRecord,
        action: &str,
        status: u16,
        outcome: Result<EgressResponse, EgressError>,
        scrubber: &Scrubber,
    ) -> Result<EgressResponse, EgressError> {
        if let Some(observer) = &self.observer {
            let delivery = match &outcome {
                Ok(_) => Delivery::Answered,
                Err(error) => error.delivery(),
            };
            observer(action, delivery);
        }
        // V9: everything that came from the server (body, headers, redirect target,
        // library and server text in errors) loses every form of the placed secret
        // before it reaches the audit row or the caller.
        let outcome = match outcome {
            Ok(response) => Ok(scrubber.response(response)),
            Err(error) => Err(scrubber.error(error)),
        };
        let event = record.event(action, status, outcome.as_ref().err(), scrubber);
        let written = self.vault.audit_record(event).await;
        match (&written, outcome) {
            (Ok(row), Ok(mut response)) => {
                response.audit_id = Some(row.id);
                Ok(response)
            }
            (_, outcome) => {
                if let Err(e) = written {
                    // The call's outcome stands (a write may have landed; turning it into an
                    // error would invite a retry). The failure is loud in the log instead.
                    tracing::error!(error = %e, action, host = %record.host, "could not write the audit row for an outbound call");
                }
                outcome
            }
        }
    }
}

/// Sends the request and reads the body up to `limit` bytes.
async fn transfer(
    http: reqwest::Client,
    request: reqwest::Request,
    limit: usize,
    mut complete: Option<CompleteFn>,
    on_head: Option<HeadObserver>,
) -> Result<Transfer, reqwest::Error> {
    let mut response = http.execute(request).await?;
    let status = response.status().as_u16();
    if let Some(observe) = on_head {
        observe(status);
    }
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    if (300..400).contains(&status) {
        // Raw here: the scrubber cuts the secret out before the target is parsed and cut
        // to host and path (V9), since parsing would re-encode or lowercase its forms.
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return Ok(Transfer {
            status,
            headers,
            body: Vec::new(),
            truncated: false,
            location,
        });
    }
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
        if let Some(complete) = complete.as_mut()
            && complete(&body)
        {
            break;
        }
    }
    Ok(Transfer {
        status,
        headers,
        body,
        truncated,
        location: None,
    })
}
