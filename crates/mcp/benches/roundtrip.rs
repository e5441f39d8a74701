//! Measures one `tools/call` through `McpClient` (vault egress, intent and completion
//! audit rows synced to disk, the anchor file, JSON-RPC framing) against a bare reqwest POST of the same body to the same local server, and
//! calls per second with 64 concurrent operations.
//!
//! Run: `cargo bench -p runwarden-mcp --bench roundtrip` (add `-- --json` for JSON lines).

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_mcp::{McpClient, ServerConfig, ToolCallRequest};
use runwarden_testkit::{Dist, LoopbackVault, TestServer, loopback_vault, mcp_handler, tool};
use runwarden_vault::CancelFlag;
use serde_json::json;

const ITERATIONS: usize = 2_000;
const CONCURRENT: usize = 64;
const CONCURRENT_CALLS: usize = 4_000;

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let json_output = std::env::args().any(|a| a == "--json");
    let server = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let url = server.url("/mcp");
    // `dir` holds the database and the anchor file: it must outlive the calls.
    let LoopbackVault {
        dir: _dir, egress, ..
    } = loopback_vault().await;
    let client = Arc::new(McpClient::new(
        ServerConfig::new("bench", url.clone()),
        egress,
    ));
    let call = || ToolCallRequest {
        tool: "echo".into(),
        arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
        correlation: None,
        gate: None,
    };
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hello"}}}).to_string();
    let bare = reqwest::Client::builder().no_proxy().build().unwrap();

    // Warm up both paths (the client's handshake happens here).
    for _ in 0..200 {
        assert!(client.call_tool(call(), None).await.result.is_success());
        bare.post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }

    let mut bare_samples = Vec::with_capacity(ITERATIONS);
    let mut client_samples = Vec::with_capacity(ITERATIONS);
    let flag = CancelFlag::new();
    for _ in 0..ITERATIONS {
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
    }
    let bare = summarise("bare reqwest POST", bare_samples);
    let through = summarise("McpClient tools/call (vault + audit)", client_samples);

    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..CONCURRENT {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in (worker..CONCURRENT_CALLS).step_by(CONCURRENT) {
                let call = ToolCallRequest {
                    tool: "echo".into(),
                    arguments: Default::default(),
                    correlation: None,
                    gate: None,
                };
                ok += usize::from(client.call_tool(call, None).await.result.is_success());
            }
            ok
        }));
    }
    let mut succeeded = 0;
    for task in tasks {
        succeeded += task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let per_second = succeeded as f64 / elapsed.as_secs_f64();

    if json_output {
        for row in [&bare, &through] {
            println!(
                "{}",
                json!({"figure": row.name, "p50_us": row.p50.as_micros(), "p99_us": row.p99.as_micros()})
            );
        }
        println!(
            "{}",
            json!({"figure": "concurrent calls per second", "concurrency": CONCURRENT, "calls": succeeded, "per_second": per_second})
        );
    } else {
        println!("tools/call round trip, {ITERATIONS} sequential calls each, 127.0.0.1");
        println!("{:<40} {:>10} {:>10}", "path", "p50", "p99");
        for row in [&bare, &through] {
            println!(
                "{:<40} {:>8}µs {:>8}µs",
                row.name,
                row.p50.as_micros(),
                row.p99.as_micros()
            );
        }
        let overhead = through.p50.saturating_sub(bare.p50);
        println!(
            "overhead at p50: {}µs ({:.2}x the bare round trip)",
            overhead.as_micros(),
            through.p50.as_secs_f64() / bare.p50.as_secs_f64()
        );
        println!(
            "{CONCURRENT} concurrent operations: {succeeded}/{CONCURRENT_CALLS} calls in {:.2} s = {per_second:.0} calls/s",
            elapsed.as_secs_f64()
        );
    }
}
