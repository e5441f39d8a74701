//! Measures cancel latency of in-flight egress calls (V6) and guarded-send overhead; run: `cargo bench -p runwarden-benches --bench cancel [-- --json]`.
//!
//! Everything runs on 127.0.0.1 against the test server of `tests/support/server.rs`. The
//! server runs on its own one-worker runtime, so the instants it records are not queued
//! behind the client's tasks; the vault writes its audit rows to SQLite in a temporary dir.
//!
//! Cancel latency: N calls stall on one server (one `CancelFlag` per call, as the runtime
//! gives one signal per outbound call); once the server holds all N requests, every flag is
//! flipped in one loop, and each sample is the instant the server saw a connection close
//! minus the instant the loop began. "tick-only" flips with `cancel_quietly` (the vault sees
//! it at its next tick: a flag wakes, so that is the 1 s backstop tick, and the flip's
//! random phase covers only the first 100 ms of it); "wake-up" flips with `cancel` (the
//! vault is woken).
//!
//! Overhead: sequential POSTs of a small JSON body, every variant interleaved in each
//! iteration so drift hits them alike, warm-up discarded.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Dist, HttpReply, Seen, TestServer};
use runwarden_vault::audit::action;
use runwarden_vault::store::VaultStore;
use runwarden_vault::{
    Algorithm, AuditEvent, CancelFlag, CancellationSignal, Credential, EgressClient, EgressConfig,
    EgressError, EgressPolicy, EgressRequest, EgressResponse, MasterKey, Method, Placement,
    SecretName, SecretValue, Vault,
};
use tokio::runtime::Handle;
use tokio::task::JoinSet;

/// A small MCP-shaped request body, about 200 bytes.
const BODY: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"tickets__create","arguments":{"title":"Printer on floor 3 is jammed again","priority":"normal","labels":["hardware","office"],"by":"bench"}}}"#;

/// What the answering server sends back, in a header over an empty body. (The test server
/// once wrote head and body as two writes without TCP_NODELAY, which cost ~40 ms per
/// request on a kept-alive connection; it now writes once with TCP_NODELAY, and the answer
/// stayed in a header so today's figures compare with the first run's.)
const ANSWER: &str =
    r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"created TCK-1042"}]}}"#;

/// (concurrent calls, rounds): about 200 to 5,000 samples per mode.
const CANCEL_CASES: [(usize, usize); 3] = [(1, 200), (100, 20), (1000, 5)];

const OVERHEAD_WARMUP: usize = 300;
const OVERHEAD_ITERATIONS: usize = 2_000;

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    // The server's own runtime: one worker, so its timestamps do not wait on client tasks.
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-server")
        .enable_all()
        .build()
        .expect("the server runtime starts");
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the client runtime starts");
    let server = server_runtime.handle().clone();

    let cancel = client_runtime.block_on(cancel_latency(&server));
    print_cancel(&cancel);
    let overhead = client_runtime.block_on(overhead(&server));
    print_overhead(&overhead);

    if json {
        for figure in &cancel {
            println!("{}", figure.json());
        }
        for line in overhead.json() {
            println!("{line}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared pieces

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn start_server(on: &Handle, reply: HttpReply) -> TestServer {
    on.spawn(TestServer::start(move |_| reply.clone()))
        .await
        .expect("the test server starts")
}

/// A vault over a fresh SQLite file in `dir` and an egress client admitting loopback, with
/// the default tick (100 ms).
async fn open_client(dir: &Path) -> EgressClient {
    let store = SqliteStore::open(dir.join("bench.db")).expect("the SQLite store opens");
    let store: Arc<dyn VaultStore> = Arc::new(store);
    let vault = Vault::open(store, MasterKey::generate(), Algorithm::default())
        .await
        .expect("the vault opens");
    let policy = EgressPolicy::new(&["127.0.0.1"]).expect("a loopback policy");
    EgressClient::new(
        Arc::new(vault),
        EgressConfig {
            policy,
            ..EgressConfig::default()
        },
    )
}

/// A short, host-free name for an outcome that was not the expected one.
fn outcome_kind(result: &Result<EgressResponse, EgressError>) -> String {
    match result {
        Ok(response) => format!("answered HTTP {}", response.status),
        Err(error) => {
            let text = error.to_string();
            text.chars().take(120).collect()
        }
    }
}

/// xorshift64: reproducible flip offsets without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let nanos = bound.as_nanos() as u64;
        Duration::from_nanos(if nanos == 0 { 0 } else { self.0 % nanos })
    }
}

// ---------------------------------------------------------------------------------------
// 1. Cancel latency

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    TickOnly,
    WakeUp,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::TickOnly => "tick-only",
            Self::WakeUp => "wake-up",
        }
    }

    fn flip(self, flag: &CancelFlag) {
        match self {
            Self::TickOnly => flag.cancel_quietly(),
            Self::WakeUp => flag.cancel(),
        }
    }
}

/// Everything measured for one (N, mode) over all its rounds.
struct CancelFigure {
    calls: usize,
    mode: Mode,
    rounds: usize,
    /// Flip to the server seeing the close, one per connection.
    closes: Dist,
    /// Flip to `send` returning `CancelledInFlight` (the audit row is written by then).
    returns: Dist,
    /// The slowest flip loop (setting all N flags).
    flip_loop: Duration,
    expected: usize,
    cancelled_in_flight: usize,
    /// Connections whose close the server did not see within 5 s of the flip.
    missing_closes: usize,
    /// Outcomes other than `CancelledInFlight`, by kind.
    other: BTreeMap<String, usize>,
}

impl CancelFigure {
    fn mismatches(&self) -> usize {
        self.expected - self.cancelled_in_flight
    }

    fn json(&self) -> String {
        serde_json::json!({
            "bench": "cancel_latency",
            "calls": self.calls,
            "mode": self.mode.name(),
            "tick_ms": 100,
            "rounds": self.rounds,
            "samples": self.closes.len(),
            "close_p50_ms": ms(self.closes.pct(50.0)),
            "close_p99_ms": ms(self.closes.pct(99.0)),
            "close_max_ms": ms(self.closes.max()),
            "returned_p50_ms": ms(self.returns.pct(50.0)),
            "returned_p99_ms": ms(self.returns.pct(99.0)),
            "flip_loop_max_ms": ms(self.flip_loop),
            "mismatches": self.mismatches(),
            "missing_closes": self.missing_closes,
        })
        .to_string()
    }
}

/// What one round produced.
#[derive(Default)]
struct Round {
    closes: Vec<Duration>,
    returns: Vec<Duration>,
    flip_loop: Duration,
    cancelled_in_flight: usize,
    missing_closes: usize,
    other: BTreeMap<String, usize>,
}

async fn cancel_latency(server_runtime: &Handle) -> Vec<CancelFigure> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let client = Arc::new(open_client(dir.path()).await);
    let mut server = start_server(server_runtime, HttpReply::Stall).await;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);

    // Warm-up: connection setup paths, the blocking pool and the audit table.
    for mode in [Mode::TickOnly, Mode::WakeUp] {
        cancel_round(&client, &mut server, 10, mode, Duration::ZERO).await;
    }

    let mut figures = Vec::new();
    for (calls, rounds) in CANCEL_CASES {
        let mut per_mode: Vec<(Mode, Vec<Round>)> = vec![
            (Mode::TickOnly, Vec::with_capacity(rounds)),
            (Mode::WakeUp, Vec::with_capacity(rounds)),
        ];
        for _ in 0..rounds {
            for (mode, results) in per_mode.iter_mut() {
                // The flip lands at a random phase of the calls' 100 ms ticks; flipping right
                // after the last request arrived would always land just after a call began,
                // so tick-only would measure nearly a whole tick every time.
                let offset = rng.below(Duration::from_millis(100));
                results.push(cancel_round(&client, &mut server, calls, *mode, offset).await);
            }
        }
        for (mode, results) in per_mode {
            let mut figure = CancelFigure {
                calls,
                mode,
                rounds,
                closes: Dist::default(),
                returns: Dist::default(),
                flip_loop: Duration::ZERO,
                expected: calls * rounds,
                cancelled_in_flight: 0,
                missing_closes: 0,
                other: BTreeMap::new(),
            };
            let mut closes = Vec::new();
            let mut returns = Vec::new();
            for round in results {
                closes.extend(round.closes);
                returns.extend(round.returns);
                figure.flip_loop = figure.flip_loop.max(round.flip_loop);
                figure.cancelled_in_flight += round.cancelled_in_flight;
                figure.missing_closes += round.missing_closes;
                for (kind, count) in round.other {
                    *figure.other.entry(kind).or_default() += count;
                }
            }
            figure.closes = Dist::new(closes);
            figure.returns = Dist::new(returns);
            figures.push(figure);
        }
    }
    figures
}

/// Starts `calls` stalled sends, waits until the server holds every request, waits
/// `offset`, flips every flag at once and times each connection's close from the flip.
async fn cancel_round(
    client: &Arc<EgressClient>,
    server: &mut TestServer,
    calls: usize,
    mode: Mode,
    offset: Duration,
) -> Round {
    let url = server.url("/mcp");
    let flags: Vec<CancelFlag> = (0..calls).map(|_| CancelFlag::new()).collect();
    let mut sends = JoinSet::new();
    for flag in &flags {
        let client = Arc::clone(client);
        let flag = flag.clone();
        let request = EgressRequest::new(Method::Post, url.clone())
            .header("content-type", "application/json")
            .body(BODY)
            .timeout(Duration::from_secs(60));
        sends.spawn(async move {
            let result = client.send(request, Some(&flag)).await;
            (Instant::now(), result)
        });
    }

    // Every request on the server, or its call over early (a failed connect, most likely).
    let mut on_server = 0;
    let mut early = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while on_server + early.len() < calls {
        tokio::select! {
            event = tokio::time::timeout_at(deadline, server.events.recv()) => match event {
                Ok(Some(Seen::Request(..))) => on_server += 1,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the test server stopped"),
                Err(_) => {
                    eprintln!(
                        "cancel bench: only {on_server} of {calls} requests reached the server within 30 s"
                    );
                    break;
                }
            },
            Some(done) = sends.join_next() => early.push(done.expect("a send task panicked")),
        }
    }
    if let Some((_, result)) = early.first() {
        eprintln!(
            "cancel bench: {} of {calls} calls ended before the flip (first: {}); with many \
             calls a failed connect usually means the open-file limit (`ulimit -n`, needs \
             about 2 x {calls} plus slack)",
            early.len(),
            outcome_kind(result),
        );
    }

    tokio::time::sleep(offset).await;
    let flipped = Instant::now();
    for flag in &flags {
        mode.flip(flag);
    }
    let mut round = Round {
        flip_loop: flipped.elapsed(),
        ..Round::default()
    };

    // The events channel is shared by all connections: count the closes.
    while round.closes.len() < on_server {
        match tokio::time::timeout(Duration::from_secs(5), server.events.recv()).await {
            Ok(Some(Seen::Closed(at))) => round.closes.push(at.saturating_duration_since(flipped)),
            Ok(Some(_)) => {}
            Ok(None) => panic!("the test server stopped"),
            Err(_) => break,
        }
    }
    round.missing_closes = on_server - round.closes.len();

    let mut outcomes = early;
    let joined = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(done) = sends.join_next().await {
            outcomes.push(done.expect("a send task panicked"));
        }
    })
    .await;
    if joined.is_err() {
        sends.abort_all();
        *round
            .other
            .entry("send did not return within 60 s of the flip".into())
            .or_default() += sends.len();
    }
    for (at, result) in outcomes {
        if let Err(EgressError::CancelledInFlight { .. }) = result {
            round.cancelled_in_flight += 1;
            round.returns.push(at.saturating_duration_since(flipped));
        } else {
            *round.other.entry(outcome_kind(&result)).or_default() += 1;
        }
    }
    round
}

fn print_cancel(figures: &[CancelFigure]) {
    println!();
    println!(
        "Cancel latency: flip -> the server sees the connection close (tick 100 ms, one CancelFlag per call)"
    );
    println!();
    println!(
        "| calls | mode      | samples | p50 ms | p99 ms | max ms | send returned p50 / p99 ms | flip loop ms | not CancelledInFlight |"
    );
    println!(
        "| ----: | --------- | ------: | -----: | -----: | -----: | -------------------------: | -----------: | --------------------: |"
    );
    for f in figures {
        println!(
            "| {:>5} | {:<9} | {:>7} | {:>6.2} | {:>6.2} | {:>6.2} | {:>11.2} / {:>12.2} | {:>12.3} | {:>21} |",
            f.calls,
            f.mode.name(),
            f.closes.len(),
            ms(f.closes.pct(50.0)),
            ms(f.closes.pct(99.0)),
            ms(f.closes.max()),
            ms(f.returns.pct(50.0)),
            ms(f.returns.pct(99.0)),
            ms(f.flip_loop),
            f.mismatches(),
        );
    }
    for f in figures {
        if f.missing_closes > 0 {
            println!(
                "  ! {} calls {}: the server saw no close for {} connection(s) within 5 s",
                f.calls,
                f.mode.name(),
                f.missing_closes
            );
        }
        for (kind, count) in &f.other {
            println!("  ! {} calls {}: {count} x {kind}", f.calls, f.mode.name());
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. Overhead of a guarded send over a bare reqwest round trip

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// (a) reqwest::Client (no proxy) POST, body read.
    Bare,
    /// (b) EgressClient::send with a bearer secret, a CancelFlag and its audit row.
    Full,
    /// (c) EgressClient::send with no credential and no signal (guard + audit row).
    Guarded,
    /// (d) EgressClient::send with a bearer secret and no signal.
    GuardedSecret,
    /// (e) Vault::audit_record alone: one audit row, no HTTP.
    AuditOnly,
}

const VARIANTS: [Variant; 5] = [
    Variant::Bare,
    Variant::Full,
    Variant::Guarded,
    Variant::GuardedSecret,
    Variant::AuditOnly,
];

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Self::Bare => "(a) bare reqwest POST",
            Self::Full => "(b) EgressClient::send, bearer secret + CancelFlag + audit",
            Self::Guarded => "(c) EgressClient::send, no credential, no signal (+ audit)",
            Self::GuardedSecret => "(d) EgressClient::send, bearer secret, no signal (+ audit)",
            Self::AuditOnly => "(e) Vault::audit_record alone, no HTTP",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Bare => "bare_reqwest",
            Self::Full => "egress_secret_signal_audit",
            Self::Guarded => "egress_no_secret_no_signal",
            Self::GuardedSecret => "egress_secret_no_signal",
            Self::AuditOnly => "audit_record_only",
        }
    }
}

struct Overhead {
    dists: Vec<(Variant, Dist)>,
}

impl Overhead {
    fn get(&self, variant: Variant) -> &Dist {
        &self
            .dists
            .iter()
            .find(|(v, _)| *v == variant)
            .expect("every variant is measured")
            .1
    }

    fn json(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .dists
            .iter()
            .map(|(v, d)| {
                serde_json::json!({
                    "bench": "egress_overhead",
                    "variant": v.key(),
                    "iterations": d.len(),
                    "body_bytes": BODY.len(),
                    "p50_us": us(d.pct(50.0)),
                    "p99_us": us(d.pct(99.0)),
                })
                .to_string()
            })
            .collect();
        let (bare, full) = (self.get(Variant::Bare), self.get(Variant::Full));
        lines.push(
            serde_json::json!({
                "bench": "egress_overhead_vs_bare",
                "p50_ratio": full.pct(50.0).as_secs_f64() / bare.pct(50.0).as_secs_f64(),
                "p50_overhead_us": us(full.pct(50.0)) - us(bare.pct(50.0)),
                "p99_overhead_us": us(full.pct(99.0)) - us(bare.pct(99.0)),
            })
            .to_string(),
        );
        lines
    }
}

async fn overhead(server_runtime: &Handle) -> Overhead {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let client = open_client(dir.path()).await;
    let secret = SecretName::new("bench-token").expect("a valid secret name");
    client
        .vault()
        .secret_put(
            &secret,
            SecretValue::new(b"bench-token-value-0123456789abcdef".to_vec()),
        )
        .await
        .expect("the secret is stored");
    let answer = HttpReply::Respond {
        status: 200,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-answer".into(), ANSWER.into()),
        ],
        body: Vec::new(),
    };
    let mut server = start_server(server_runtime, answer).await;
    let url = server.url("/mcp");
    let bare = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a bare reqwest client");
    let flag = CancelFlag::new();
    let audit_event = AuditEvent {
        time_ms: 0,
        action: action::HTTP_CALL.into(),
        success: true,
        secret: Some(secret.to_string()),
        method: "POST".into(),
        host: "127.0.0.1".into(),
        path: "/mcp".into(),
        status: 200,
        duration_ms: 0,
        error: None,
        reason: Some("benchmark".into()),
        actor: "bench".into(),
        correlation: None,
        intent_id: None,
    };

    let run = async |variant: Variant| match variant {
        Variant::Bare => {
            let response = bare
                .post(&url)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("the bare POST is answered");
            assert_eq!(response.status().as_u16(), 200);
            assert_eq!(
                response.headers().get("x-answer").map(|v| v.len()),
                Some(ANSWER.len())
            );
            let body = response.bytes().await.expect("the bare body is read");
            assert!(body.is_empty());
        }
        Variant::AuditOnly => {
            client
                .vault()
                .audit_record(audit_event.clone())
                .await
                .expect("the audit row is written");
        }
        Variant::Full | Variant::Guarded | Variant::GuardedSecret => {
            let mut request = EgressRequest::new(Method::Post, url.clone())
                .header("content-type", "application/json")
                .body(BODY);
            if variant != Variant::Guarded {
                request = request.credential(Credential {
                    secret: secret.clone(),
                    placement: Placement::Bearer,
                });
            }
            let signal: Option<&dyn CancellationSignal> = match variant {
                Variant::Full => Some(&flag),
                _ => None,
            };
            let response = client
                .send(request, signal)
                .await
                .expect("the guarded POST is answered");
            assert_eq!(response.status, 200);
            assert_eq!(
                response.header("x-answer").map(str::len),
                Some(ANSWER.len())
            );
            assert!(response.body.is_empty());
            assert!(response.audit_id.is_some(), "the audit row was written");
        }
    };

    // The credential really goes out: check one request's head before timing anything.
    run(Variant::Full).await;
    let head = server.next_request(Duration::from_secs(5)).await.raw;
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer bench-token-value"),
        "the bearer credential reached the server"
    );

    let mut samples: Vec<Vec<Duration>> = VARIANTS
        .iter()
        .map(|_| Vec::with_capacity(OVERHEAD_ITERATIONS))
        .collect();
    for i in 0..OVERHEAD_WARMUP + OVERHEAD_ITERATIONS {
        // Rotate the order so no variant always runs first after the drain below.
        for k in 0..VARIANTS.len() {
            let slot = (i + k) % VARIANTS.len();
            let started = Instant::now();
            run(VARIANTS[slot]).await;
            let took = started.elapsed();
            if i >= OVERHEAD_WARMUP {
                samples[slot].push(took);
            }
        }
        while server.events.try_recv().is_ok() {}
    }

    Overhead {
        dists: VARIANTS
            .iter()
            .copied()
            .zip(samples.into_iter().map(Dist::new))
            .collect(),
    }
}

fn print_overhead(o: &Overhead) {
    let bare = o.get(Variant::Bare);
    println!();
    println!(
        "Overhead: sequential POST of {} bytes to 127.0.0.1, keep-alive, {} iterations after {} warm-up, variants interleaved",
        BODY.len(),
        OVERHEAD_ITERATIONS,
        OVERHEAD_WARMUP
    );
    println!();
    println!(
        "| variant                                                     | p50 us | p99 us | p50 vs (a) |"
    );
    println!(
        "| ----------------------------------------------------------- | -----: | -----: | ---------: |"
    );
    for (variant, d) in &o.dists {
        println!(
            "| {:<59} | {:>6.0} | {:>6.0} | {:>9.2}x |",
            variant.label(),
            us(d.pct(50.0)),
            us(d.pct(99.0)),
            d.pct(50.0).as_secs_f64() / bare.pct(50.0).as_secs_f64(),
        );
    }
    let p50 = |v: Variant| us(o.get(v).pct(50.0));
    let p99 = |v: Variant| us(o.get(v).pct(99.0));
    println!();
    println!(
        "(b) over (a): p50 {:.2}x, +{:.0} us at p50, +{:.0} us at p99",
        p50(Variant::Full) / p50(Variant::Bare),
        p50(Variant::Full) - p50(Variant::Bare),
        p99(Variant::Full) - p99(Variant::Bare),
    );
    println!(
        "p50 split: guard + audit row + request building (c)-(a) {:+.0} us, of which audit row alone (e) {:.0} us; secret open + placement (d)-(c) {:+.0} us; signal (b)-(d) {:+.0} us",
        p50(Variant::Guarded) - p50(Variant::Bare),
        p50(Variant::AuditOnly),
        p50(Variant::GuardedSecret) - p50(Variant::Guarded),
        p50(Variant::Full) - p50(Variant::GuardedSecret),
    );
}
