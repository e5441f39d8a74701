//! The transfer and what its end means: the answer, a redirect that is not followed, a
//! transport failure (with what is known of delivery), a cancel or the backstop, each
//! written as the call's outcome row.

use std::time::Duration;

use url::Url;

use super::EgressClient;
use super::config::BACKSTOP_GRACE;
use super::drive::Driven;
use super::record::CallRecord;
use super::wire::{describe_reqwest, transfer};
use crate::audit::action;
use crate::delivery::Delivery;
use crate::error::EgressError;
use crate::message::{CompleteFn, EgressRequest, EgressResponse};
use crate::scrub::{Scrubber, StreamScrub};
use crate::signal::CancellationSignal;

/// How a transfer ended, with the bounds it ran under (the errors name them).
pub(super) struct Ended {
    driven: Driven,
    timeout: Duration,
    backstop: Duration,
}

impl EgressClient {
    /// Sends the built request and drives it to its end, asking the signal on the way.
    pub(super) async fn send_wire(
        &self,
        request: &mut EgressRequest,
        wire: reqwest::Request,
        signal: Option<&dyn CancellationSignal>,
        scrubber: &Scrubber,
    ) -> Ended {
        let timeout = request.timeout.unwrap_or(self.config.default_timeout);
        let backstop = timeout + self.config.connect_timeout + BACKSTOP_GRACE;
        // V9: the caller's hook reads the body while it arrives (an MCP client hands the
        // server's progress and log messages on from it), so it sees it scrubbed too.
        // The body grows a chunk at a time: the scrub keeps what it cleaned up to the last
        // line break and looks again only at what came after (a line never splits an
        // escape, so no spelling of a secret is cut in two by the window).
        let complete_when = request.complete_when.take().map(|mut complete| {
            let mut stream = StreamScrub::new(scrubber.clone());
            Box::new(move |body: &[u8]| complete(&stream.view(body))) as CompleteFn
        });
        // The transfer lives in this block only, so it is dropped as soon as it is driven
        // to its end: a cancelled one closes its socket before anything else happens.
        let driven = {
            let transfer = std::pin::pin!(transfer(
                self.http.clone(),
                wire,
                request.max_response_bytes,
                complete_when,
                request.on_head.take(),
            ));
            self.drive(transfer, signal, backstop).await
        };
        if matches!(driven, Driven::Cancelled) {
            // V6: dropping the transfer woke its connection's task, which closes the
            // socket. Let it run before this task writes the outcome: after thousands of
            // cancels at once, the writes would otherwise queue every close behind them.
            tokio::task::yield_now().await;
        }
        Ended {
            driven,
            timeout,
            backstop,
        }
    }

    /// Writes the outcome row (naming the intent) and hands back what came back, scrubbed.
    /// `answered` is the action of a call that reached the network; `dpop_url` the target
    /// of a call whose token is bound to a key, whose server's nonce the next proof uses.
    pub(super) async fn conclude(
        &self,
        record: &CallRecord,
        answered: &'static str,
        ended: Ended,
        dpop_url: Option<&Url>,
        scrubber: &Scrubber,
    ) -> Result<EgressResponse, EgressError> {
        let (action, status, outcome) = judge(ended, answered, record.host.clone());
        if let Ok(response) = &outcome {
            tracing::debug!(host = %record.host, status, reason = ?record.reason, "outbound call answered");
            if let Some(url) = dpop_url
                && let Some(nonce) = response.header("dpop-nonce")
            {
                self.vault.dpop_nonces.remember(url, nonce);
            }
        }
        self.finish(record, action, status, outcome, scrubber).await
    }
}

/// The audit action, the status and the outcome of an ended transfer.
fn judge(
    ended: Ended,
    answered: &'static str,
    host: String,
) -> (&'static str, u16, Result<EgressResponse, EgressError>) {
    let Ended {
        driven,
        timeout,
        backstop,
    } = ended;
    match driven {
        Driven::Done(Ok(t)) if (300..400).contains(&t.status) => {
            let location = t.location.unwrap_or_else(|| "(no location)".into());
            let error = EgressError::Redirect {
                host,
                status: t.status,
                location,
            };
            (answered, t.status, Err(error))
        }
        Driven::Done(Ok(t)) => {
            let response = EgressResponse {
                status: t.status,
                headers: t.headers,
                body: t.body,
                truncated: t.truncated,
                audit_id: None,
            };
            (answered, t.status, Ok(response))
        }
        Driven::Done(Err(e)) => (answered, 0, Err(transport_error(e, host, timeout))),
        Driven::Cancelled => {
            let error = EgressError::CancelledInFlight { host };
            (action::HTTP_CALL_CANCELLED, 0, Err(error))
        }
        Driven::SignalPanicked => {
            let error = EgressError::SignalPanicked {
                host,
                delivery: Delivery::MaybeDelivered,
            };
            (answered, 0, Err(error))
        }
        Driven::Backstop => {
            let error = EgressError::Backstop {
                host,
                after: backstop,
            };
            (answered, 0, Err(error))
        }
    }
}

/// A transfer that failed: a timeout or another transport fault, with what is known of
/// whether the request reached the server.
fn transport_error(error: reqwest::Error, host: String, timeout: Duration) -> EgressError {
    // V8: only a failure to connect proves that no request byte left; a timeout or a reset
    // after that may have reached the server.
    let delivery = if error.is_connect() {
        Delivery::NotSent
    } else {
        Delivery::MaybeDelivered
    };
    if error.is_timeout() {
        EgressError::Timeout {
            host,
            after: timeout,
            delivery,
        }
    } else {
        EgressError::Transport {
            host,
            detail: describe_reqwest(error),
            delivery,
        }
    }
}
