//! Cancel at the wire: the signal is asked before anything that costs, then while the
//! transfer is in flight, and a stop drops the connection at once.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Duration;

use super::EgressClient;
use super::wire::Transfer;
use crate::audit::action;
use crate::delivery::Delivery;
use crate::error::EgressError;
use crate::signal::CancellationSignal;

/// What a signal answered.
enum SignalRead {
    Go,
    Stop,
    Panicked,
}

fn ask(signal: &dyn CancellationSignal) -> SignalRead {
    match std::panic::catch_unwind(AssertUnwindSafe(|| signal.is_cancelled())) {
        Ok(false) => SignalRead::Go,
        Ok(true) => SignalRead::Stop,
        Err(_) => SignalRead::Panicked,
    }
}

/// The first question, before the guard, the secret and the socket: the audit action
/// and error of a call that must not start, or `None` to go on.
pub(super) fn stopped_before_send(
    signal: Option<&dyn CancellationSignal>,
    host: &str,
) -> Option<(&'static str, EgressError)> {
    match ask(signal?) {
        SignalRead::Go => None,
        SignalRead::Stop => Some((
            action::HTTP_CALL_CANCELLED_BEFORE_SEND,
            EgressError::CancelledBeforeSend,
        )),
        SignalRead::Panicked => Some((
            action::HTTP_CALL_REFUSED,
            EgressError::SignalPanicked {
                host: host.to_string(),
                delivery: Delivery::NotSent,
            },
        )),
    }
}

/// How driving a transfer ended.
pub(super) enum Driven {
    Done(Result<Transfer, reqwest::Error>),
    Cancelled,
    SignalPanicked,
    Backstop,
}

impl EgressClient {
    /// Drives a transfer while asking the signal. The caller owns the transfer (so it is
    /// stored once in the call's state, not again here) and drops it as soon as this
    /// answers: dropping it closes its socket.
    pub(super) async fn drive(
        &self,
        mut transfer: Pin<&mut impl Future<Output = Result<Transfer, reqwest::Error>>>,
        signal: Option<&dyn CancellationSignal>,
        backstop: Duration,
    ) -> Driven {
        let deadline = tokio::time::sleep(backstop);
        let mut deadline = std::pin::pin!(deadline);
        let Some(signal) = signal else {
            return tokio::select! {
                result = transfer.as_mut() => Driven::Done(result),
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
                result = transfer.as_mut() => return Driven::Done(result),
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
                SignalRead::Go => {}
                SignalRead::Stop => {
                    // O5: the cancel as an event of the call's span, then the teardown.
                    tracing::info!(woken, "cancel observed; tearing the connection down");
                    return Driven::Cancelled;
                }
                SignalRead::Panicked => return Driven::SignalPanicked,
            }
        }
    }
}
