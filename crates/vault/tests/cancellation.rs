//! V6: the cancellable send against a real server that accepts and never answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runwarden_vault::audit::action;
use runwarden_vault::{
    CancelFlag, CancellationSignal, Credential, EgressError, EgressRequest, Method, Placement,
    WakeFuture,
};
use tokio::sync::Notify;

use crate::support::{Fixture, fixture};
use runwarden_testkit::{HttpReply, TestServer};

const WAIT: Duration = Duration::from_secs(10);

/// Starts a guarded POST with the sigil as bearer against a stalling server and waits
/// until the server holds the request.
async fn stalled_call<S: CancellationSignal + Clone + 'static>(
    signal: S,
) -> (
    Fixture,
    TestServer,
    tokio::task::JoinHandle<Result<runwarden_vault::EgressResponse, EgressError>>,
) {
    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let mut server = TestServer::start(|_| HttpReply::Stall).await;
    let request = EgressRequest::new(Method::Post, server.url("/mcp"))
        .body(b"{\"jsonrpc\":\"2.0\"}".to_vec())
        .credential(Credential {
            secret,
            placement: Placement::Bearer,
        });
    let client = f.client.clone();
    let call = tokio::spawn(async move { client.send(request, Some(&signal)).await });
    server.next_request(WAIT).await;
    (f, server, call)
}

#[tokio::test]
async fn flipping_the_signal_mid_transfer_closes_the_connection_and_returns_in_flight() {
    let flag = CancelFlag::new();
    let (f, mut server, call) = stalled_call(flag.clone()).await;
    flag.cancel();
    server.next_close(WAIT).await;
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(err, EgressError::CancelledInFlight { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("cancelled"));
    let row = f.completion_row().await;
    assert_eq!(row.event.action, action::HTTP_CALL_CANCELLED);
    assert_eq!((row.event.status, row.event.success), (0, false));
    assert_eq!(
        row.event.secret.as_deref(),
        Some("api"),
        "the credential went out: the row names it"
    );
}

#[tokio::test]
async fn a_wake_that_never_comes_is_covered_by_the_backstop_tick() {
    let flag = CancelFlag::new();
    let (f, mut server, call) = stalled_call(flag.clone()).await;
    let flipped = Instant::now();
    flag.cancel_quietly();
    let closed = server.next_close(WAIT).await;
    // Generous bound: a flag wakes, so the vault only polls it on the backstop tick (5 s by
    // default); this catches a backstop that stopped working.
    assert!(
        closed.duration_since(flipped)
            < runwarden_vault::DEFAULT_BACKSTOP_TICK + Duration::from_secs(3),
        "took {:?}",
        closed.duration_since(flipped)
    );
    assert!(matches!(
        call.await.unwrap(),
        Err(EgressError::CancelledInFlight { .. })
    ));
    assert_eq!(
        f.completion_row().await.event.action,
        action::HTTP_CALL_CANCELLED
    );
}

#[tokio::test]
async fn a_signal_already_true_on_entry_reads_no_secret_and_opens_no_connection() {
    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let server = TestServer::start(|_| HttpReply::Stall).await;
    let flag = CancelFlag::new();
    flag.cancel();
    let request = EgressRequest::new(Method::Post, server.url("/mcp")).credential(Credential {
        secret,
        placement: Placement::Bearer,
    });
    let err = f.client.send(request, Some(&flag)).await.unwrap_err();
    assert!(matches!(err, EgressError::CancelledBeforeSend), "{err}");
    assert_eq!(
        f.secret_reads(),
        0,
        "no secret is read for a call cancelled before send"
    );
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        0,
        "nothing egresses"
    );
    let row = f.only_audit_row().await;
    assert_eq!(
        (row.event.action.as_str(), row.event.status),
        (action::HTTP_CALL_CANCELLED_BEFORE_SEND, 0)
    );
}

/// A signal that cannot wake: the vault must poll it.
#[derive(Clone, Default)]
struct Unwakeable(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl CancellationSignal for Unwakeable {
    fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_signal_that_cannot_wake_is_still_asked_every_100_ms() {
    let signal = Unwakeable::default();
    let (_f, mut server, call) = stalled_call(signal.clone()).await;
    let flipped = Instant::now();
    signal.0.store(true, Ordering::SeqCst);
    let closed = server.next_close(WAIT).await;
    // V6: the 100 ms tick stays for signals without a wake-up; well under the 1 s backstop.
    let took = closed.duration_since(flipped);
    assert!(took < Duration::from_millis(600), "took {took:?}");
    assert!(matches!(
        call.await.unwrap(),
        Err(EgressError::CancelledInFlight { .. })
    ));
}

/// A flag that reports every question the vault asks, so a test can line up with a tick.
#[derive(Clone, Default)]
struct WatchedFlag {
    flag: CancelFlag,
    asks: std::sync::Arc<AtomicUsize>,
    asked: std::sync::Arc<Notify>,
}

impl CancellationSignal for WatchedFlag {
    fn is_cancelled(&self) -> bool {
        self.asks.fetch_add(1, Ordering::SeqCst);
        self.asked.notify_one();
        self.flag.is_cancelled()
    }
    fn woken(&self) -> WakeFuture<'_> {
        self.flag.woken()
    }
}

#[tokio::test]
async fn a_wake_ends_the_transfer_well_before_the_next_tick() {
    let signal = WatchedFlag::default();
    let (_f, mut server, call) = stalled_call(signal.clone()).await;
    // Line up just after a tick: the next one is ~100 ms away.
    let before = signal.asks.load(Ordering::SeqCst);
    loop {
        tokio::time::timeout(WAIT, signal.asked.notified())
            .await
            .expect("the vault asks at every tick");
        if signal.asks.load(Ordering::SeqCst) > before {
            break;
        }
    }
    let asks_before_cancel = signal.asks.load(Ordering::SeqCst);
    let flipped = Instant::now();
    signal.flag.cancel();
    let closed = server.next_close(WAIT).await;
    let took = closed.duration_since(flipped);
    assert!(
        took < Duration::from_millis(50),
        "a woken cancel took {took:?}, as slow as a tick"
    );
    assert!(matches!(
        call.await.unwrap(),
        Err(EgressError::CancelledInFlight { .. })
    ));
    assert_eq!(
        signal.asks.load(Ordering::SeqCst),
        asks_before_cancel + 1,
        "one question, prompted by the wake"
    );
}

/// Panics on the n-th question.
#[derive(Clone)]
struct PanicsOnAsk {
    asks: std::sync::Arc<AtomicUsize>,
    panic_at: usize,
}

impl CancellationSignal for PanicsOnAsk {
    fn is_cancelled(&self) -> bool {
        let n = self.asks.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.panic_at {
            panic!("the signal broke (deliberately, in a test)");
        }
        false
    }
}

#[tokio::test]
async fn a_signal_that_panics_in_flight_ends_the_call_and_completes_its_intent() {
    let signal = PanicsOnAsk {
        asks: Default::default(),
        panic_at: 2,
    };
    let (f, mut server, call) = stalled_call(signal).await;
    server.next_close(WAIT).await;
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, EgressError::SignalPanicked { .. }), "{err}");
    let row = f.completion_row().await;
    assert_eq!(
        (row.event.action.as_str(), row.event.success),
        (action::HTTP_CALL, false)
    );
}

#[tokio::test]
async fn a_signal_that_panics_before_send_reads_no_secret_and_sends_nothing() {
    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let server = TestServer::start(|_| HttpReply::Stall).await;
    let signal = PanicsOnAsk {
        asks: Default::default(),
        panic_at: 1,
    };
    let request = EgressRequest::new(Method::Get, server.url("/")).credential(Credential {
        secret,
        placement: Placement::Bearer,
    });
    let err = f.client.send(request, Some(&signal)).await.unwrap_err();
    assert!(matches!(err, EgressError::SignalPanicked { .. }), "{err}");
    assert_eq!(
        (f.secret_reads(), server.connections.load(Ordering::SeqCst)),
        (0, 0)
    );
    assert_eq!(
        f.only_audit_row().await.event.action,
        action::HTTP_CALL_REFUSED
    );
}

/// Each call in flight holds its future's state for as long as it waits, so 10,000 idle
/// calls hold it 10,000 times. It was 6,048 bytes before the request stopped being stored
/// twice and the audit writes were boxed (4,360 since, in release and debug builds alike);
/// the bound catches a change that brings either back.
#[tokio::test]
async fn a_call_in_flight_holds_under_five_kib_of_state() {
    let f = fixture().await;
    let request = EgressRequest::new(Method::Post, "http://127.0.0.1:9/x");
    let flag = CancelFlag::new();
    let call = f.client.send(request, Some(&flag));
    let size = std::mem::size_of_val(&call);
    assert!(size < 5 * 1024, "an outbound call's state is {size} bytes");
}
