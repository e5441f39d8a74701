//! A local server over stdio against the same tool over Streamable HTTP, in one run: the
//! official Python SDK's `echo` (`tests/peer/stdio_server.py` started by the client,
//! `tests/peer/server.py` on 127.0.0.1), each through `McpClient` with the vault's intent
//! and outcome rows synced to disk. Then, over stdio: the time from a cancel to the
//! handler seeing it (`slow`), and to the process group gone when the handler ignores it
//! (`stubborn`, 200 ms grace).
//!
//! Needs `RUNWARDEN_PEER_PYTHON` (`scripts/peer-venv.sh`). Run:
//! `cargo bench -p runwarden-benches --bench stdio`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_mcp::stdio::{EnvValue, SandboxMode, StdioConfig};
use runwarden_mcp::{McpCall, McpClient, NoticeSink, ServerConfig};
use runwarden_testkit::{Dist, LoopbackVault, Peer, loopback_vault};
use runwarden_vault::CancelFlag;
use serde_json::json;

const SEQUENTIAL: usize = 500;
const CONCURRENT: usize = 64;
const CONCURRENT_CALLS: usize = 2_000;
const CANCELS: usize = 20;

fn echo() -> McpCall {
    McpCall {
        tool: "echo".into(),
        arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
        ..McpCall::default()
    }
}

fn local(f: &LoopbackVault, events: &Path, sandbox: SandboxMode, grace: Duration) -> McpClient {
    let (python, script) = runwarden_testkit::stdio_peer();
    let mut stdio = StdioConfig::new(python, script);
    stdio.sandbox = sandbox;
    stdio.cancel_grace = grace;
    stdio.env.insert(
        "PEER_EVENTS".into(),
        EnvValue::Literal(events.display().to_string()),
    );
    McpClient::new(ServerConfig::local("local", stdio), f.egress.clone())
}

async fn sequential(client: &McpClient) -> Dist {
    let mut samples = Vec::with_capacity(SEQUENTIAL);
    for _ in 0..SEQUENTIAL {
        let started = Instant::now();
        let outcome = client.call_tool(echo(), None).await;
        assert!(outcome.result.error.is_none(), "{}", outcome.result.text);
        samples.push(started.elapsed());
    }
    Dist::new(samples)
}

async fn concurrent(client: Arc<McpClient>) -> f64 {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..CONCURRENT {
        let client = client.clone();
        let calls =
            CONCURRENT_CALLS / CONCURRENT + usize::from(worker < CONCURRENT_CALLS % CONCURRENT);
        tasks.spawn(async move {
            for _ in 0..calls {
                let outcome = client.call_tool(echo(), None).await;
                assert!(outcome.result.error.is_none(), "{}", outcome.result.text);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    CONCURRENT_CALLS as f64 / started.elapsed().as_secs_f64()
}

fn events(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Polls `check` every 200 µs (this is a measurement, not a test) for at most 20 s.
async fn until(check: impl Fn() -> bool) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    Instant::now()
}

/// From cancel to the handler's `slow_cancelled`, and to the call's end.
async fn cancel_seen(client: Arc<McpClient>, events_at: PathBuf) -> (Duration, Duration) {
    let before = events(&events_at).matches("slow_cancelled").count();
    let (first, mut progressed) = tokio::sync::mpsc::unbounded_channel();
    let mut slow = McpCall {
        tool: "slow".into(),
        arguments: json!({"seconds": 30}).as_object().unwrap().clone(),
        ..McpCall::default()
    };
    slow.notices = Some(NoticeSink::new(move |n| {
        let _ = first.send(n);
    }));
    let stop = Arc::new(CancelFlag::new());
    let calling = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move { client.call_tool(slow, Some(&*stop)).await })
    };
    progressed.recv().await.unwrap();
    let cancelled = Instant::now();
    stop.cancel();
    let outcome = calling.await.unwrap();
    let ended = cancelled.elapsed();
    assert!(outcome.result.error.is_some());
    let seen = until(|| events(&events_at).matches("slow_cancelled").count() > before).await;
    (seen - cancelled, ended)
}

/// From cancel of a call the handler ignores to its process gone.
async fn group_gone(client: Arc<McpClient>, events_at: PathBuf) -> Duration {
    let started = events(&events_at).matches("stubborn_started").count();
    let stop = Arc::new(CancelFlag::new());
    let calling = {
        let (client, stop) = (client.clone(), stop.clone());
        let stubborn = McpCall {
            tool: "stubborn".into(),
            arguments: json!({"seconds": 60}).as_object().unwrap().clone(),
            ..McpCall::default()
        };
        tokio::spawn(async move { client.call_tool(stubborn, Some(&*stop)).await })
    };
    until(|| events(&events_at).matches("stubborn_started").count() > started).await;
    // The host's pids of the server (inside its sandbox it is pid 1), by its environment.
    let marker = format!("PEER_EVENTS={}", events_at.display());
    assert!(!runwarden_testkit::pids_with_env(&marker).is_empty());
    let cancelled = Instant::now();
    stop.cancel();
    calling.await.unwrap();
    let gone = until(|| runwarden_testkit::pids_with_env(&marker).is_empty()).await;
    gone - cancelled
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let f = loopback_vault().await;
    let dir = tempfile::tempdir().unwrap();
    let events_at = dir.path().join("events");
    let peer = tokio::task::spawn_blocking(|| Peer::start(&["--stateless", "--json-response"]))
        .await
        .unwrap();
    let http = Arc::new(McpClient::new(
        ServerConfig::new("http", peer.url())
            .with_protocol(runwarden_mcp::ProtocolPolicy::Handshake),
        f.egress.clone(),
    ));
    let mut figures = Vec::new();
    for sandbox in [SandboxMode::Unsandboxed, SandboxMode::Namespace] {
        let stdio = Arc::new(local(&f, &events_at, sandbox, Duration::from_millis(200)));
        // Warm both: the process and the session.
        stdio.call_tool(echo(), None).await;
        figures.push((
            format!("stdio, sandbox {}", sandbox.as_str()),
            sequential(&stdio).await,
            concurrent(stdio.clone()).await,
        ));
        stdio.close().await.unwrap();
    }
    http.call_tool(echo(), None).await;
    figures.push((
        "Streamable HTTP (stateless, JSON)".to_string(),
        sequential(&http).await,
        concurrent(http.clone()).await,
    ));
    println!(
        "tools/call echo, the official Python SDK's server, {SEQUENTIAL} sequential and {CONCURRENT_CALLS} with {CONCURRENT} callers:"
    );
    for (name, dist, rate) in &figures {
        println!(
            "  {name:<36} p50 {:>9}  p99 {:>9}  {rate:>7.0} calls/s",
            ms(dist.pct(50.0)),
            ms(dist.pct(99.0))
        );
    }

    let stdio = Arc::new(local(
        &f,
        &events_at,
        SandboxMode::Namespace,
        Duration::from_millis(200),
    ));
    stdio.call_tool(echo(), None).await;
    let (mut seen, mut ended) = (Vec::new(), Vec::new());
    for _ in 0..CANCELS {
        let (s, e) = cancel_seen(stdio.clone(), events_at.clone()).await;
        seen.push(s);
        ended.push(e);
    }
    let (seen, ended) = (Dist::new(seen), Dist::new(ended));
    println!("cancel over stdio ({CANCELS} times, sandboxed):");
    println!(
        "  call ended after the cancel          p50 {:>9}  p99 {:>9}",
        ms(ended.pct(50.0)),
        ms(ended.pct(99.0))
    );
    println!(
        "  handler saw the cancel               p50 {:>9}  p99 {:>9}",
        ms(seen.pct(50.0)),
        ms(seen.pct(99.0))
    );
    let mut gone = Vec::new();
    for _ in 0..5 {
        gone.push(group_gone(stdio.clone(), events_at.clone()).await);
    }
    let gone = Dist::new(gone);
    println!(
        "  ignored, process group gone (200 ms grace) p50 {:>9}  max {:>9}",
        ms(gone.pct(50.0)),
        ms(gone.max())
    );
    stdio.close().await.unwrap();
    http.close().await.unwrap();
}
