//! The guarded egress client: one audited, cancellable, bounded HTTP call at a time.
//!
//! [`EgressClient::send`] is where a call's checks read in their order, top to bottom:
//! the signal, the guard (with the operator's allow list), the credential, the
//! exfiltration check, the placement, the audit intent, the send, and the scrub and
//! outcome row. The steps live beside it: the settings (`config`), the wire request and
//! transfer (`wire`), cancel in flight (`drive`), the audit rows (`record`), what an ended
//! transfer means (`outcome`), and the exfiltration refusals (`exfiltration`). The
//! sandbox's egress proxy (`proxy`, [`EgressClient::serve_proxy`]) puts the connections
//! of a local MCP server under the same guard and audit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::Instrument as _;

use crate::delivery::Delivery;
use crate::dpop::{self, DpopKey};
use crate::error::EgressError;
use crate::guard;
use crate::placement::{Credential, Placement};
use crate::resolver::{Resolver, SystemResolver};
use crate::scrub::Scrubber;
use crate::secret::SecretValue;
use crate::signal::CancellationSignal;
use crate::vault::Vault;

mod config;
mod drive;
mod environment;
pub use environment::EnvironmentFor;
mod exfiltration;
mod outcome;
mod proxy;
mod record;
mod wire;

use crate::message::{EgressRequest, EgressResponse};
use config::MAX_BACKSTOP_TICK;
pub use config::{DEFAULT_BACKSTOP_TICK, EgressConfig, MAX_TICK};
pub use proxy::{PROXY_MAX_CONNECTIONS, ProxyLabel};
use record::CallRecord;
use wire::PinTable;

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
        let http = wire::http_client(config.connect_timeout, pins.clone());
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
    ///
    /// Written as a function that returns its future, not as an `async fn`: an `async fn`
    /// keeps its arguments twice in its state, and each call in flight holds that state
    /// for as long as it waits.
    pub fn send<'a>(
        &'a self,
        request: EgressRequest,
        signal: Option<&'a dyn CancellationSignal>,
    ) -> impl Future<Output = Result<EgressResponse, EgressError>> + 'a {
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
        let call = self.send_in_span(request, signal).instrument(span.clone());
        Delivered { call, span }
    }

    /// One call, its checks in order; each refusal writes the call's one audit row.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep the request twice in the state of every call in flight"
    )]
    fn send_in_span<'a>(
        &'a self,
        mut request: EgressRequest,
        signal: Option<&'a dyn CancellationSignal>,
    ) -> impl Future<Output = Result<EgressResponse, EgressError>> + 'a {
        async move {
            let mut record = CallRecord::new(&request);
            let unscrubbed = Scrubber::none();

            // V6: the first question comes before the guard, the secret and the socket.
            if let Some((action, error)) = drive::stopped_before_send(signal, &record.host) {
                return self
                    .finish(&record, action, 0, Err(error), &unscrubbed)
                    .await;
            }

            // V4: the guard (the operator's allow list among its rules) decides before any
            // secret is read.
            let target =
                match guard::vet_target(&self.config.policy, &*self.resolver, &request.url).await {
                    Ok(target) => target,
                    Err(refusal) => {
                        return self.refuse(&record, refusal.into(), &unscrubbed).await;
                    }
                };
            record.vetted(&target);

            // The credential, the scrubber and the wire request, in a block of their own:
            // the secret's value and the DPoP key are dropped once the request is built,
            // not kept while it is in flight.
            let (scrubber, wire, bound) = {
                // The credential's value, and what comes back is searched for every stored
                // secret and the one placed here.
                let (secret, dpop_key) =
                    match self.read_credential(request.credential.as_ref()).await {
                        Ok(read) => read,
                        Err(error) => return self.refuse(&record, error, &unscrubbed).await,
                    };
                let scrubber = match self
                    .scrubber(request.credential.as_ref(), secret.as_ref())
                    .await
                {
                    Ok(scrubber) => scrubber,
                    Err(error) => return self.refuse(&record, error, &unscrubbed).await,
                };

                // No secret leaves for a host it does not belong to: checked before the
                // intent row, so a refused request sends nothing and writes one row naming
                // the secret.
                if let Some(error) = exfiltration::carried_refusal(&mut record, &request, &scrubber)
                {
                    return self.refuse(&record, error, &scrubber).await;
                }

                // The placement: the credential (with its proof of key) where the request
                // says.
                match self.build(&request, &target, secret.as_ref(), dpop_key.as_ref()) {
                    Ok(wire) => (scrubber, wire, dpop_key.is_some()),
                    Err(error) => return self.refuse(&record, error, &scrubber).await,
                }
            };

            // The audit intent, committed before any byte goes out, then the caller's last
            // check (the runtime's write fence); either failing keeps the request unsent.
            let on_intent = request.on_intent.take();
            let due = match self.record_intent(&mut record, on_intent, &scrubber).await {
                Ok(due) => due,
                Err(error) => return self.refuse(&record, error, &scrubber).await,
            };
            // The anchor file follows the committed intent while the request goes out: the
            // row is on disk already, and an anchor may lag the log but never lead it.
            let anchored = async {
                if let Some(due) = due {
                    due.write().await;
                }
            };
            let transfer = async {
                if let Some(check) = request.before_transfer.take()
                    && let Err(reason) = check().await
                {
                    return Err(EgressError::Held { reason });
                }
                // The send; then what came back is scrubbed and the outcome row names the
                // intent.
                Ok(self.send_wire(&mut request, wire, signal, &scrubber).await)
            };
            let (ended, ()) = tokio::join!(transfer, anchored);
            let ended = match ended {
                Ok(ended) => ended,
                Err(held) => return self.refuse(&record, held, &scrubber).await,
            };
            let dpop_url = bound.then_some(&target.url);
            self.conclude(&record, request.action, ended, dpop_url, &scrubber)
                .await
        }
    }

    /// Reads what a credential places: a stored secret, or the access token of an OAuth
    /// grant the vault holds (M18) with the DPoP key it is bound to.
    async fn read_credential(
        &self,
        credential: Option<&Credential>,
    ) -> Result<(Option<SecretValue>, Option<DpopKey>), EgressError> {
        let Some(credential) = credential else {
            return Ok((None, None));
        };
        let read = match credential.placement {
            Placement::OAuth => self.vault.oauth_access_use(&credential.secret).await,
            _ => self
                .vault
                .secret_use(&credential.secret)
                .await
                .map(|value| (value, None)),
        };
        let (value, key) = read.map_err(EgressError::Credential)?;
        Ok((Some(value), key))
    }

    /// The scrubber of this call: every stored secret, and the value placed on it.
    async fn scrubber(
        &self,
        credential: Option<&Credential>,
        secret: Option<&SecretValue>,
    ) -> Result<Scrubber, EgressError> {
        let matcher = self
            .vault
            .secret_matcher()
            .await
            .map_err(EgressError::Store)?;
        let placed = credential.map(|c| c.secret.as_str()).zip(secret);
        Ok(Scrubber::new(Some(matcher), placed))
    }
}

pin_project_lite::pin_project! {
    /// An outbound call's future that records on the call's span how the call ended.
    struct Delivered<F> {
        #[pin]
        call: F,
        span: tracing::Span,
    }
}

impl<F: Future<Output = Result<EgressResponse, EgressError>>> Future for Delivered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.call.poll(cx));
        match &result {
            Ok(response) => {
                this.span.record("delivery", Delivery::Answered.as_str());
                this.span
                    .record("http.response.status_code", response.status);
            }
            Err(error) => {
                this.span.record("delivery", error.delivery().as_str());
            }
        }
        Poll::Ready(result)
    }
}
