//! Measures the status watcher at scale (R6 amended, V6): run-status reads per second and idle CPU with 1, 100, 1,000 and 10,000 calls in flight in one process, and how long 10,000 in-flight calls cancelled at once take to be closed at the server; run: `cargo bench -p runwarden-benches --bench inflight [-- --json]`, or `-- cancel` for the cancel trials alone in `BENCH_CANCEL_ROUNDS` rounds (default 3).
//!
//! Every call is a real guarded `EgressClient::send` (audit intent row, then a POST) to a
//! server that holds the request and never answers: `runwarden-testkit`'s `TestServer` in
//! a child process (this bench re-run with `--stall-server`), because 10,000 calls and
//! their 10,000 server ends would not fit one process's open-file limit. The child reports
//! every request and close with a wall-clock time; the calls' runs live in a SQLite file in
//! a temporary directory.
//!
//! Idle: once the server holds all N requests, one settling second, then a 5 s window:
//! the process's CPU time (utime + stime from `/proc/self/stat`, all threads; the server is
//! in the other process) and the run-status queries made. "watcher" is this build: one
//! `StatusWatcher`, calls ask it from memory, the vault asks a waking signal on a 1 s
//! backstop tick (and, at 10,000 calls, on the default 5 s, to show what the tick costs). "seed" reproduces the design before it, side by side: each call's signal
//! reads its own row (a synchronous read on a read-only connection) at most once a second,
//! on the vault's 100 ms tick.
//!
//! Cancel: every run row is cancelled in one committed UPDATE; t0 is the instant it
//! committed, and a sample is a close seen by the server minus t0. "hub" then wakes each
//! run through the `CancelHub` (what `Executor::cancel` does after its row update);
//! "feed" publishes one `Change::Status { Cancelled }` per run on the store's change feed
//! (what a PostgreSQL NOTIFY from another node becomes); "poll" announces nothing (another
//! process on the SQLite file; the periodic refresh finds it). Baselines in the same run:
//! the vault's own `CancelFlag` flipped with a wake-up (no store at all), and bare reqwest
//! POSTs whose futures are dropped at t0. Each trial also reports the CPU time this process
//! and the server's spent from t0 to the last close: both share the machine's cores, so
//! what one spends during the teardown the other waits for.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runwarden_benches::{cpu_time, rss_kib};
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{CancelHub, RunStore, StatusWatcher, WatcherConfig};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{HttpReply, Seen, TestServer};
use runwarden_vault::{
    Algorithm, CancellationSignal, EgressClient, EgressConfig, EgressPolicy, EgressRequest,
    MasterKey, Method, Vault,
};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

#[path = "inflight/cancel.rs"]
mod cancel;
use cancel::{
    CancelFigure, CpuMark, Wake, bare_cancel, cancel_json, cancel_only, flag_cancel, print_cancels,
    watcher_cancel,
};

const CALLS: [usize; 4] = [1, 100, 1_000, 10_000];
const SETTLE: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_secs(5);
const CANCEL_CALLS: usize = 10_000;
const BODY: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"tickets__create","arguments":{"title":"Printer on floor 3"}}}"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--stall-server") {
        stall_server();
        return;
    }
    runwarden_benches::raise_nofile();
    if let Some(what) = args.iter().skip_while(|a| *a != "--rss").nth(1) {
        rss_child(what);
        return;
    }
    let json = args.iter().any(|a| a == "--json");
    if args.iter().any(|a| a == "cancel") {
        cancel_only(json);
        return;
    }
    // Memory first, each in a process of its own: a heap that earlier rounds grew and
    // freed would hide what the calls take.
    let rss: Vec<(&str, f64)> = [
        ("watcher", "guarded call (vault, audit, watcher)"),
        ("bare", "bare reqwest POST"),
    ]
    .into_iter()
    .map(|(what, label)| (label, rss_in_child(what)))
    .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the client runtime starts");
    let started = Instant::now();
    let (idle, cancels) = runtime.block_on(bench());
    print_idle(&idle);
    println!();
    println!(
        "Resident memory per idle in-flight call, {CANCEL_CALLS} calls, each kind in a fresh process"
    );
    for (label, kib) in &rss {
        println!("{label:<40} {kib:>8.1} KiB");
    }
    print_cancels(&cancels);
    println!();
    println!("(took {:.1} s)", started.elapsed().as_secs_f64());
    if json {
        for figure in &idle {
            println!(
                "{}",
                serde_json::json!({"bench": "inflight_idle", "design": figure.design, "calls": figure.calls,
                    "reads_per_s": figure.reads_per_s, "cpu_pct_of_a_core": figure.cpu_pct, "in_flight": figure.in_flight})
            );
        }
        for (label, kib) in &rss {
            println!(
                "{}",
                serde_json::json!({"bench": "inflight_rss", "calls": CANCEL_CALLS, "kind": label, "rss_kib_per_call": kib})
            );
        }
        for figure in &cancels {
            println!("{}", cancel_json(figure, None));
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn wall_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

// ---------------------------------------------------------------------------------------
// The stalling server, in a child process

/// Child mode: a stalling `TestServer`; prints `PORT p`, then `R t` per request and `C t`
/// per close (t in wall-clock nanoseconds); exits when its stdin closes.
fn stall_server() {
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the server runtime starts");
    runtime.block_on(async {
        runwarden_benches::raise_nofile();
        let mut server = TestServer::start(|_| HttpReply::Stall).await;
        let (base_instant, base_wall) = (Instant::now(), wall_nanos());
        let to_wall = |at: Instant| -> i128 {
            if at >= base_instant {
                base_wall + at.duration_since(base_instant).as_nanos() as i128
            } else {
                base_wall - base_instant.duration_since(at).as_nanos() as i128
            }
        };
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        writeln!(out, "PORT {}", server.addr.port()).ok();
        out.flush().ok();
        while let Some(seen) = server.events.recv().await {
            match seen {
                Seen::Request(at, _) => writeln!(out, "R {}", to_wall(at)).ok(),
                Seen::Closed(at) => writeln!(out, "C {}", to_wall(at)).ok(),
                Seen::Connected(_) => Some(()),
            };
            if server.events.is_empty() {
                out.flush().ok();
            }
        }
    });
}

/// What the child saw.
enum Event {
    Request,
    Closed(i128),
}

struct StallServer {
    child: Child,
    url: String,
    events: mpsc::UnboundedReceiver<Event>,
}

impl Drop for StallServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StallServer {
    fn start() -> Self {
        let exe = std::env::current_exe().expect("the bench's own path");
        let mut child = Command::new(exe)
            .arg("--stall-server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server process starts");
        let mut lines = BufReader::new(child.stdout.take().expect("its stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let port = first
            .strip_prefix("PORT ")
            .and_then(|p| p.parse::<u16>().ok())
            .expect("the server process says its port");
        let (tx, events) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let event = match line.split_once(' ') {
                    Some(("R", _)) => Event::Request,
                    Some(("C", t)) => Event::Closed(t.parse().unwrap_or(0)),
                    _ => continue,
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            events,
        }
    }

    /// Waits until the server holds `n` more requests; false if it did not within `within`.
    async fn requests(&mut self, n: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        let mut seen = 0;
        while seen < n {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(Event::Request)) => seen += 1,
                Ok(Some(Event::Closed(_))) => {}
                Ok(None) | Err(_) => {
                    eprintln!("inflight bench: the server holds {seen} of {n} requests");
                    return false;
                }
            }
        }
        true
    }

    /// The next `n` closes as times after `t0` (wall-clock nanoseconds).
    async fn closes(&mut self, n: usize, t0: i128, within: Duration) -> Vec<Duration> {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(Event::Closed(at))) => {
                    out.push(Duration::from_nanos((at - t0).max(0) as u64));
                }
                Ok(Some(Event::Request)) => {}
                Ok(None) | Err(_) => {
                    eprintln!("inflight bench: {} of {n} closes seen", out.len());
                    break;
                }
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// The seed's signal, reproduced for the side-by-side figure

/// Before the watcher: each call's signal read its own row, synchronously, at most once
/// per second, and could not wake the vault (so the vault polled it every 100 ms).
struct SeedSignal {
    run_id: String,
    probe: Arc<Mutex<rusqlite::Connection>>,
    reads: Arc<AtomicU64>,
    last: Mutex<Option<Instant>>,
    cancelled: AtomicBool,
}

impl CancellationSignal for SeedSignal {
    fn is_cancelled(&self) -> bool {
        if self.cancelled.load(Ordering::SeqCst) {
            return true;
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return false;
        }
        *last = Some(Instant::now());
        self.reads.fetch_add(1, Ordering::SeqCst);
        let conn = self.probe.lock().unwrap_or_else(|p| p.into_inner());
        let status: Option<String> = conn
            .prepare_cached("SELECT status FROM runs WHERE id = ?1")
            .and_then(|mut stmt| stmt.query_row([&self.run_id], |row| row.get(0)))
            .ok();
        let cancelled = status.as_deref() == Some("cancelled");
        self.cancelled.store(cancelled, Ordering::SeqCst);
        cancelled
    }
}

// ---------------------------------------------------------------------------------------
// The bench

struct Ctx {
    store: Arc<SqliteStore>,
    egress: Arc<EgressClient>,
    /// The same vault with the default backstop tick (5 s, the longest accepted).
    egress_slow_backstop: Arc<EgressClient>,
    hub: Arc<CancelHub>,
    watcher: StatusWatcher,
    raw: rusqlite::Connection,
    probe: Arc<Mutex<rusqlite::Connection>>,
    runs: Vec<String>,
}

impl Ctx {
    async fn open(dir: &Path) -> Self {
        let path = dir.join("runwarden.db");
        let store = Arc::new(SqliteStore::open(&path).expect("the SQLite store opens"));
        let vault = Vault::open(store.clone(), MasterKey::generate(), Algorithm::default())
            .await
            .expect("the vault opens");
        // The default backstop (5 s) beside a 1 s one, to show what the tick costs.
        let slow = EgressConfig {
            policy: EgressPolicy::new(&["127.0.0.1"]).expect("a loopback policy"),
            ..EgressConfig::default()
        };
        let vault = Arc::new(vault);
        let config = EgressConfig {
            backstop_tick: Duration::from_secs(1),
            ..slow.clone()
        };
        let egress = Arc::new(EgressClient::new(vault.clone(), config));
        let egress_slow_backstop = Arc::new(EgressClient::new(vault, slow));
        let hub = Arc::new(CancelHub::new());
        let watcher = StatusWatcher::new(store.clone(), hub.clone(), WatcherConfig::default());
        let mut runs = Vec::with_capacity(CANCEL_CALLS);
        for _ in 0..CANCEL_CALLS {
            let id = uuid::Uuid::now_v7().to_string();
            store
                .run_create(RunCreate {
                    id: id.clone(),
                    agent: "bench".into(),
                    correlation: id.clone(),
                    request: None,
                    status: NewRunStatus::Running {
                        owner: "bench".into(),
                        lease_until_ms: i64::MAX,
                    },
                    now_ms: 0,
                    origin: Default::default(),
                })
                .await
                .expect("a run row");
            runs.push(id);
        }
        let raw = rusqlite::Connection::open(&path).expect("a second connection");
        raw.busy_timeout(Duration::from_secs(10))
            .expect("a busy timeout");
        let probe = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .expect("a read-only connection");
        Self {
            store,
            egress,
            egress_slow_backstop,
            hub,
            watcher,
            raw,
            probe: Arc::new(Mutex::new(probe)),
            runs,
        }
    }

    /// Every run back to `running`, as before a trial.
    fn reset(&self) {
        self.raw
            .execute("UPDATE runs SET status = 'running'", [])
            .expect("reset the runs");
    }

    /// Cancels every run in one committed UPDATE; returns its commit time.
    fn cancel_all(&self) -> i128 {
        self.raw
            .execute("UPDATE runs SET status = 'cancelled'", [])
            .expect("cancel the runs");
        wall_nanos()
    }

    fn request(&self, url: &str) -> EgressRequest {
        EgressRequest::new(Method::Post, url)
            .header("content-type", "application/json")
            .body(BODY)
            .timeout(Duration::from_secs(300))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Design {
    Watcher,
    /// The watcher with the vault's default backstop tick (5 s).
    WatcherSlowBackstop,
    Seed,
}

impl Design {
    fn name(self) -> &'static str {
        match self {
            Self::Watcher => "watcher (1 s backstop)",
            Self::WatcherSlowBackstop => "watcher (5 s backstop, default)",
            Self::Seed => "seed (per-call reads)",
        }
    }

    fn calls(self) -> &'static [usize] {
        match self {
            Self::WatcherSlowBackstop => &[CANCEL_CALLS],
            _ => &CALLS,
        }
    }
}

struct IdleFigure {
    design: &'static str,
    calls: usize,
    in_flight: usize,
    reads_per_s: f64,
    cpu_pct: f64,
}

/// Starts `n` guarded calls of the first `n` runs; each waits on the server.
async fn start_calls(
    ctx: &Ctx,
    url: &str,
    n: usize,
    design: Design,
    reads: &Arc<AtomicU64>,
) -> JoinSet<()> {
    let mut calls = JoinSet::new();
    for id in &ctx.runs[..n] {
        let request = ctx.request(url);
        let egress = match design {
            Design::WatcherSlowBackstop => ctx.egress_slow_backstop.clone(),
            _ => ctx.egress.clone(),
        };
        match design {
            Design::Watcher | Design::WatcherSlowBackstop => {
                let watcher = ctx.watcher.clone();
                let id = id.clone();
                calls.spawn(async move {
                    let signal = watcher.signal(&id).await;
                    let _ = egress.send(request, Some(&signal)).await;
                });
            }
            Design::Seed => {
                let signal = SeedSignal {
                    run_id: id.clone(),
                    probe: ctx.probe.clone(),
                    reads: reads.clone(),
                    last: Mutex::new(None),
                    cancelled: AtomicBool::new(false),
                };
                calls.spawn(async move {
                    let _ = egress.send(request, Some(&signal)).await;
                });
            }
        }
    }
    calls
}

async fn bench() -> (Vec<IdleFigure>, Vec<CancelFigure>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ctx = Ctx::open(dir.path()).await;
    let mut server = StallServer::start();
    let url = server.url.clone();
    let mut idle = Vec::new();
    let mut cancels = Vec::new();

    for design in [Design::Watcher, Design::WatcherSlowBackstop, Design::Seed] {
        for &n in design.calls() {
            ctx.reset();
            let seed_reads = Arc::new(AtomicU64::new(0));
            let mut calls = start_calls(&ctx, &url, n, design, &seed_reads).await;
            let all = server.requests(n, Duration::from_secs(120)).await;
            tokio::time::sleep(SETTLE).await;
            let reads = || match design {
                Design::Watcher | Design::WatcherSlowBackstop => ctx.watcher.queries(),
                Design::Seed => seed_reads.load(Ordering::SeqCst),
            };
            let (cpu0, reads0, at0) = (cpu_time(), reads(), Instant::now());
            tokio::time::sleep(WINDOW).await;
            let (cpu1, reads1, took) = (cpu_time(), reads(), at0.elapsed());
            idle.push(IdleFigure {
                design: design.name(),
                calls: n,
                in_flight: if all { n } else { 0 },
                reads_per_s: (reads1 - reads0) as f64 / took.as_secs_f64(),
                cpu_pct: 100.0 * (cpu1 - cpu0).as_secs_f64() / took.as_secs_f64(),
            });
            // End the calls: the 10,000 of the watcher are the "hub" cancel trial; the
            // seed's are its poll-only cancel, side by side.
            let t0 = ctx.cancel_all();
            let mark = CpuMark::now(&server);
            let variant = match design {
                Design::Watcher | Design::WatcherSlowBackstop => {
                    for id in &ctx.runs[..n] {
                        ctx.hub.wake(id);
                    }
                    if design == Design::Watcher {
                        "watcher, woken through the hub"
                    } else {
                        "watcher (5 s backstop), woken through the hub"
                    }
                }
                Design::Seed => "seed, poll only (1 s throttle, 100 ms tick)",
            };
            let closes = server.closes(n, t0, Duration::from_secs(60)).await;
            let closed = mark.closed();
            while calls.join_next().await.is_some() {}
            if n == CANCEL_CALLS {
                cancels.push(CancelFigure::new(variant, closes, closed.ended()));
            }
        }
    }

    // The watcher woken by the change feed, and by nothing.
    for (variant, feed) in [
        ("watcher, woken by the change feed (NOTIFY)", true),
        ("watcher, poll only (periodic refresh)", false),
    ] {
        let wake = if feed { Wake::Feed } else { Wake::Nothing };
        cancels.push(watcher_cancel(&ctx, &mut server, variant, wake).await);
    }
    cancels.push(flag_cancel(&ctx, &mut server).await);
    cancels.push(bare_cancel(&mut server).await);
    drop(server);
    (idle, cancels)
}

/// `n` bare reqwest POSTs of [`BODY`] to `url`, each its own task.
fn bare_calls(bare: &reqwest::Client, url: &str, n: usize) -> JoinSet<()> {
    let mut calls = JoinSet::new();
    for _ in 0..n {
        let request = bare
            .post(url)
            .header("content-type", "application/json")
            .body(BODY);
        calls.spawn(async move {
            let _ = request.send().await;
        });
    }
    calls
}

/// Runs this bench again with `--rss WHAT` and reads the KiB per call it prints.
fn rss_in_child(what: &str) -> f64 {
    let out = Command::new(std::env::current_exe().expect("the bench's own path"))
        .args(["--rss", what])
        .stderr(Stdio::inherit())
        .output()
        .expect("the memory child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("RSS_KIB_PER_CALL "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the memory child printed no figure: {text}"))
}

/// Child mode: `CANCEL_CALLS` idle calls of one kind (`watcher`: guarded sends with the
/// default backstop; `bare`: reqwest POSTs) after one warm-up call of that kind, then
/// prints how much the resident set grew per call.
fn rss_child(what: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the client runtime starts");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ctx = Ctx::open(dir.path()).await;
        let mut server = StallServer::start();
        let url = server.url.clone();
        let unused = Arc::new(AtomicU64::new(0));
        let bare = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a bare reqwest client");
        let start = |n: usize| bare_calls(&bare, &url, n);
        // One call of the kind first, so what is made once per process is not counted.
        let warm = match what {
            "bare" => start(1),
            _ => start_calls(&ctx, &url, 1, Design::WatcherSlowBackstop, &unused).await,
        };
        server.requests(1, Duration::from_secs(30)).await;
        tokio::time::sleep(SETTLE).await;
        let before = rss_kib(None);
        let calls = match what {
            "bare" => start(CANCEL_CALLS),
            _ => {
                start_calls(
                    &ctx,
                    &url,
                    CANCEL_CALLS,
                    Design::WatcherSlowBackstop,
                    &unused,
                )
                .await
            }
        };
        let all = server
            .requests(CANCEL_CALLS, Duration::from_secs(120))
            .await;
        assert!(all, "the server holds every call");
        tokio::time::sleep(SETTLE).await;
        let grown = rss_kib(None).saturating_sub(before);
        println!("RSS_KIB_PER_CALL {}", grown as f64 / CANCEL_CALLS as f64);
        drop((calls, warm));
    });
}

fn print_idle(figures: &[IdleFigure]) {
    println!();
    println!(
        "Calls in flight, idle ({} s window after a {} s settle): run-status reads per second and CPU of this process",
        WINDOW.as_secs(),
        SETTLE.as_secs()
    );
    println!(
        "{:<26} {:>8} {:>10} {:>12} {:>14}",
        "design", "calls", "in flight", "reads/s", "CPU % of core"
    );
    for f in figures {
        println!(
            "{:<26} {:>8} {:>10} {:>12.1} {:>14.1}",
            f.design, f.calls, f.in_flight, f.reads_per_s, f.cpu_pct
        );
    }
}
