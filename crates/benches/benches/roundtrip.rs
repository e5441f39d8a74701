//! Measures one `tools/call` through `McpClient` (vault egress, intent and completion
//! audit rows synced to disk, the anchor file, JSON-RPC framing) against a bare reqwest
//! POST of the same body to the same local server, and against the official Rust MCP SDK's
//! client (`rmcp` with its Streamable HTTP transport), sequentially and as calls per
//! second with 64 concurrent callers. The SDK runs twice: as shipped (`from_uri`: its
//! reqwest client keeps no idle connection, at most 16 POSTs in flight) and tuned (a
//! pooled reqwest client, 64 POSTs in flight), so our figure meets its best one.
//!
//! A second server issues an `Mcp-Session-Id` (M13): our client runs against it too, so
//! the figures show one session reused by every call (one `initialize`, one `DELETE` at
//! the end) next to the stateless server, the bare POST and the SDK, in the same run.
//!
//! A third client runs on its own store opened with `durability = "process_crash"` (the
//! operator's faster mode: the intent is committed but not synced before the request
//! leaves), so the cost of the sync shows beside the default. Beside them, one synced
//! SQLite commit of a small row, with no call, is timed in the same loop: the floor the
//! default's durable intent cannot go under on this disk.
//!
//! Run: `cargo bench -p runwarden-benches --bench roundtrip` (add `-- --json` for JSON lines;
//! `BENCH_CONCURRENT_CALLS=N` makes each path's part with 64 callers N calls long, for a
//! profile; `BENCH_ONLY=ours|fast|session|pooled` runs only that path's part with 64
//! callers, after the warm-up, so a profile or a count of system calls sees it alone).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, ServiceExt};
use runwarden_mcp::{McpCall, McpClient, ServerConfig};
use runwarden_testkit::{
    Dist, HttpReply, LoopbackVault, Seen, TestServer, loopback_vault, loopback_vault_with,
    mcp_handler, tool,
};
use runwarden_vault::CancelFlag;
use serde_json::{Map, Value, json};

const ITERATIONS: usize = 2_000;
const CONCURRENT: usize = 64;
const CONCURRENT_CALLS: usize = 4_000;

/// Calls per path with 64 callers: `BENCH_CONCURRENT_CALLS` when set (a longer phase for a
/// profile), else [`CONCURRENT_CALLS`].
fn concurrent_calls() -> usize {
    std::env::var("BENCH_CONCURRENT_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CONCURRENT_CALLS)
}

const BARE: &str = "bare reqwest POST";
const OURS: &str = "McpClient tools/call (vault + audit)";
const OURS_SESSION: &str = "McpClient, one session reused (M13)";
const OURS_FAST: &str = "McpClient, durability process_crash";
const RMCP_DEFAULT: &str = "rmcp client (SDK defaults)";
const RMCP_POOLED: &str = "rmcp client (pooled, 64 in flight)";
const SYNCED: &str = "one synced SQLite commit (no call)";

struct Row {
    name: &'static str,
    p50: Duration,
    p99: Duration,
}

fn summarise(name: &'static str, samples: Vec<Duration>) -> Row {
    let dist = Dist::new(samples);
    Row {
        name,
        p50: dist.pct(50.0),
        p99: dist.pct(99.0),
    }
}

struct Throughput {
    name: &'static str,
    succeeded: usize,
    elapsed: Duration,
    /// The process's CPU time over the run (the server's share included, the same for
    /// every path), to the kernel's 10 ms tick.
    cpu: Duration,
}

impl Throughput {
    fn per_second(&self) -> f64 {
        self.succeeded as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU time per call, in microseconds: what bounds calls/s once both cores are busy.
    fn cpu_per_call_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.succeeded.max(1) as f64
    }
}

/// A SQLite file in WAL mode with `synchronous = FULL`, as the store writes a durable
/// intent, holding one small table.
fn synced_floor(dir: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(dir.join("floor.db")).expect("a scratch database");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
         CREATE TABLE rows (id INTEGER PRIMARY KEY, body BLOB NOT NULL);",
    )
    .expect("the scratch table");
    conn
}

/// [`concurrent_calls`] calls from `CONCURRENT` tasks, each calling in a loop; `call`
/// answers whether its call succeeded.
async fn throughput<F, Fut>(name: &'static str, call: F) -> Throughput
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let (started, cpu) = (Instant::now(), runwarden_benches::cpu_time());
    let calls = concurrent_calls();
    let mut tasks = Vec::new();
    for worker in 0..CONCURRENT {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in (worker..calls).step_by(CONCURRENT) {
                ok += usize::from(call().await);
            }
            ok
        }));
    }
    let mut succeeded = 0;
    for task in tasks {
        succeeded += task.await.unwrap();
    }
    Throughput {
        name,
        succeeded,
        elapsed: started.elapsed(),
        cpu: runwarden_benches::cpu_time().saturating_sub(cpu),
    }
}

/// The SDK's client, handshake done (`initialize`, then `notifications/initialized`).
async fn rmcp_client(
    transport: StreamableHttpClientTransport<reqwest_sdk::Client>,
) -> RunningService<RoleClient, ()> {
    ().serve(transport)
        .await
        .expect("the SDK client's handshake")
}

/// The testkit's MCP server, issuing one session id on `initialize` and ending it on
/// `DELETE`, as a stateful server does (M13).
fn session_handler() -> impl Fn(&runwarden_testkit::HttpRequest) -> HttpReply + Send + Sync + 'static
{
    let inner = mcp_handler(vec![tool("echo")], &[]);
    move |request| {
        if request.method == "DELETE" {
            return HttpReply::text(200, "");
        }
        let initialize = request.body.windows(12).any(|w| w == b"\"initialize\"");
        let reply = inner(request);
        if initialize {
            reply.with_header("mcp-session-id", "bench-session")
        } else {
            reply
        }
    }
}

/// What reached a server, by HTTP method and JSON-RPC method.
fn methods_seen(server: &mut TestServer) -> std::collections::BTreeMap<String, usize> {
    let mut methods = std::collections::BTreeMap::<String, usize>::new();
    while let Ok(seen) = server.events.try_recv() {
        if let Seen::Request(_, request) = seen {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            let key = match body["method"].as_str() {
                Some(method) => format!("{} {method}", request.method),
                None => request.method,
            };
            *methods.entry(key).or_default() += 1;
        }
    }
    methods
}

/// [`throughput`] of `echo` calls through `client`.
async fn ours_throughput(name: &'static str, client: Arc<McpClient>) -> Throughput {
    throughput(name, move || {
        let client = client.clone();
        async move {
            let call = McpCall {
                tool: "echo".into(),
                ..McpCall::default()
            };
            client.call_tool(call, None).await.result.is_success()
        }
    })
    .await
}

async fn rmcp_call(peer: &Peer<RoleClient>, arguments: Map<String, Value>) -> bool {
    let params = CallToolRequestParams::new("echo").with_arguments(arguments);
    matches!(peer.call_tool(params).await, Ok(result) if result.is_error != Some(true))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let json_output = std::env::args().any(|a| a == "--json");
    let mut server = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let url = server.url("/mcp");
    // `dir` holds the database and the anchor file: it must outlive the calls.
    let LoopbackVault {
        dir: _dir, egress, ..
    } = loopback_vault().await;
    let LoopbackVault {
        dir: _fast_dir,
        egress: fast_egress,
        ..
    } = loopback_vault_with(runwarden_store_sqlite::Durability::ProcessCrash).await;
    let fast_client = Arc::new(McpClient::new(
        ServerConfig::new("bench-fast", url.clone()),
        fast_egress,
    ));
    let mut session_server = TestServer::start(session_handler()).await;
    let session_client = Arc::new(McpClient::new(
        ServerConfig::new("bench-session", session_server.url("/mcp")),
        egress.clone(),
    ));
    let client = Arc::new(McpClient::new(
        ServerConfig::new("bench", url.clone()),
        egress,
    ));
    let call = || McpCall {
        tool: "echo".into(),
        arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
        correlation: None,
        gate: None,
        elicitor: None,
        output_schema: None,
        notices: None,
        ..Default::default()
    };
    let arguments = || json!({"text": "hello"}).as_object().unwrap().clone();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hello"}}}).to_string();
    let bare = reqwest::Client::builder().no_proxy().build().unwrap();
    let rmcp_default = rmcp_client(StreamableHttpClientTransport::from_uri(url.clone())).await;
    let rmcp_pooled = rmcp_client(StreamableHttpClientTransport::with_client(
        reqwest_sdk::Client::builder().no_proxy().build().unwrap(),
        StreamableHttpClientTransportConfig::with_uri(url.clone())
            .max_concurrent_requests(CONCURRENT),
    ))
    .await;

    // Warm up every path (our client's handshake happens here).
    for _ in 0..200 {
        assert!(client.call_tool(call(), None).await.result.is_success());
        assert!(
            fast_client
                .call_tool(call(), None)
                .await
                .result
                .is_success()
        );
        assert!(
            session_client
                .call_tool(call(), None)
                .await
                .result
                .is_success()
        );
        bare.post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(rmcp_call(&rmcp_default, arguments()).await);
        assert!(rmcp_call(&rmcp_pooled, arguments()).await);
    }

    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let row = match only.as_str() {
            "ours" => ours_throughput(OURS, client).await,
            "fast" => ours_throughput(OURS_FAST, fast_client).await,
            "session" => ours_throughput(OURS_SESSION, session_client).await,
            "pooled" => {
                let peer = rmcp_pooled.peer().clone();
                throughput(RMCP_POOLED, move || {
                    let peer = peer.clone();
                    async move { rmcp_call(&peer, Map::new()).await }
                })
                .await
            }
            other => panic!("BENCH_ONLY names ours, fast, session or pooled, not {other:?}"),
        };
        println!(
            "{}: {}/{} calls, {:.2} s, {:.0} calls/s, {:.0} CPU µs/call",
            row.name,
            row.succeeded,
            concurrent_calls(),
            row.elapsed.as_secs_f64(),
            row.per_second(),
            row.cpu_per_call_us()
        );
        return;
    }

    // The paths take turns, call by call, so a burst of load on the shared machine
    // lands on all of them alike.
    let mut bare_samples = Vec::with_capacity(ITERATIONS);
    let mut client_samples = Vec::with_capacity(ITERATIONS);
    let mut rmcp_default_samples = Vec::with_capacity(ITERATIONS);
    let mut rmcp_pooled_samples = Vec::with_capacity(ITERATIONS);
    let mut session_samples = Vec::with_capacity(ITERATIONS);
    let mut fast_samples = Vec::with_capacity(ITERATIONS);
    let flag = CancelFlag::new();
    let floor_dir = tempfile::tempdir().expect("a temporary directory");
    let floor = synced_floor(floor_dir.path());
    let mut synced_samples = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        let started = Instant::now();
        floor
            .execute("INSERT INTO rows (body) VALUES (?1)", [[7u8; 256]])
            .expect("a synced commit");
        synced_samples.push(started.elapsed());

        let started = Instant::now();
        let response = bare
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        response.bytes().await.unwrap();
        bare_samples.push(started.elapsed());

        let started = Instant::now();
        let outcome = client.call_tool(call(), Some(&flag)).await;
        client_samples.push(started.elapsed());
        assert!(outcome.result.is_success());

        let started = Instant::now();
        let outcome = fast_client.call_tool(call(), Some(&flag)).await;
        fast_samples.push(started.elapsed());
        assert!(outcome.result.is_success());

        let started = Instant::now();
        let outcome = session_client.call_tool(call(), Some(&flag)).await;
        session_samples.push(started.elapsed());
        assert!(outcome.result.is_success());

        let started = Instant::now();
        let ok = rmcp_call(&rmcp_default, arguments()).await;
        rmcp_default_samples.push(started.elapsed());
        assert!(ok);

        let started = Instant::now();
        let ok = rmcp_call(&rmcp_pooled, arguments()).await;
        rmcp_pooled_samples.push(started.elapsed());
        assert!(ok);
    }
    let bare = summarise(BARE, bare_samples);
    let through = summarise(OURS, client_samples);
    let fast = summarise(OURS_FAST, fast_samples);
    let synced = summarise(SYNCED, synced_samples);
    let sequential = [
        &bare,
        &synced,
        &through,
        &fast,
        &summarise(OURS_SESSION, session_samples),
        &summarise(RMCP_DEFAULT, rmcp_default_samples),
        &summarise(RMCP_POOLED, rmcp_pooled_samples),
    ];

    let ours = ours_throughput(OURS, client).await;
    let ours_fast = ours_throughput(OURS_FAST, fast_client).await;
    let ours_session = ours_throughput(OURS_SESSION, session_client.clone()).await;
    // M13: the session ends with one DELETE.
    session_client.close().await.expect("the session ends");
    let session_methods = methods_seen(&mut session_server);
    assert_eq!(
        session_methods.get("POST initialize"),
        Some(&1),
        "{session_methods:?}"
    );
    assert_eq!(
        session_methods.get("DELETE"),
        Some(&1),
        "{session_methods:?}"
    );
    let mut concurrent = vec![ours, ours_fast, ours_session];
    for (name, service) in [(RMCP_DEFAULT, &rmcp_default), (RMCP_POOLED, &rmcp_pooled)] {
        let peer = service.peer().clone();
        concurrent.push(
            throughput(name, move || {
                let peer = peer.clone();
                async move { rmcp_call(&peer, Map::new()).await }
            })
            .await,
        );
    }
    for service in [rmcp_default, rmcp_pooled] {
        service.cancel().await.expect("the SDK client closes");
    }
    // What reached the server, by method. The server is stateless (no session id), so the
    // SDK client opens no GET stream and sends no DELETE: this line shows only POSTs.
    let methods = methods_seen(&mut server);

    if json_output {
        for row in sequential {
            println!(
                "{}",
                json!({"figure": row.name, "p50_us": row.p50.as_micros(), "p99_us": row.p99.as_micros()})
            );
        }
        for row in &concurrent {
            println!(
                "{}",
                json!({"figure": "concurrent calls per second", "path": row.name, "concurrency": CONCURRENT, "calls": row.succeeded, "per_second": row.per_second(), "cpu_us_per_call": row.cpu_per_call_us()})
            );
        }
        println!(
            "{}",
            json!({"figure": "requests by method", "methods": methods})
        );
        println!(
            "{}",
            json!({"figure": "requests by method, session server", "methods": session_methods})
        );
    } else {
        println!("tools/call round trip, {ITERATIONS} sequential calls each, 127.0.0.1");
        println!("{:<40} {:>10} {:>10}", "path", "p50", "p99");
        for row in sequential {
            println!(
                "{:<40} {:>8}µs {:>8}µs",
                row.name,
                row.p50.as_micros(),
                row.p99.as_micros()
            );
        }
        for row in [&through, &fast] {
            let overhead = row.p50.saturating_sub(bare.p50);
            println!(
                "overhead at p50, {}: {}µs ({:.2}x the bare round trip)",
                row.name,
                overhead.as_micros(),
                row.p50.as_secs_f64() / bare.p50.as_secs_f64()
            );
        }
        println!(
            "overhead at p50 beyond one synced commit, {}: {}µs",
            through.name,
            through
                .p50
                .saturating_sub(bare.p50)
                .saturating_sub(synced.p50)
                .as_micros()
        );
        println!(
            "{CONCURRENT} concurrent callers, {} calls each path",
            concurrent_calls()
        );
        println!(
            "{:<40} {:>10} {:>10} {:>10} {:>12}",
            "path", "ok", "seconds", "calls/s", "CPU µs/call"
        );
        for row in &concurrent {
            println!(
                "{:<40} {:>10} {:>10.2} {:>10.0} {:>12.0}",
                row.name,
                format!("{}/{}", row.succeeded, concurrent_calls()),
                row.elapsed.as_secs_f64(),
                row.per_second(),
                row.cpu_per_call_us()
            );
        }
        println!("requests the server saw, by method: {methods:?}");
        println!("requests the session server saw, by method: {session_methods:?}");
    }
}
