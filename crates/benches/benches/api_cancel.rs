//! Measures a cancel through the HTTP API while the run's tool call is on the wire: from
//! the API answering `POST /v1/runs/{id}/cancel` to the MCP server seeing the connection
//! close, against a real `runwarden serve` (its workers execute the runs).
//!
//! Run: `cargo bench -p runwarden-benches --bench api_cancel` (add `-- --json` for JSON lines).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_testkit::{Dist, Seen, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use common::runwarden;

const TRIALS: usize = 100;
const WAIT: Duration = Duration::from_secs(20);

fn main() {
    let json_output = std::env::args().any(|a| a == "--json");
    // The MCP server runs on its own runtime so its close timestamps are not delayed.
    let server_runtime = common::one_thread_runtime();
    let client_runtime = common::one_thread_runtime();
    let mut mcp = server_runtime.block_on(TestServer::start(mcp_handler(
        vec![tool("create")],
        &["create"],
    )));

    let dir = tempfile::tempdir().unwrap();
    runwarden(dir.path(), &["init"]);
    let config = dir.path().join("runwarden.toml");
    let mut text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\nallow = []\n", "\nallow = [\"127.0.0.1\"]\n");
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n",
        mcp.url("/mcp")
    ));
    text = text.replace("concurrency = 4\n", "concurrency = 4\nreap_seconds = 60\n");
    std::fs::write(&config, text).unwrap();
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "never"}]);
    std::fs::write(dir.path().join("plan.json"), plan.to_string()).unwrap();
    runwarden(dir.path(), &["mcp", "import", "srv"]);
    let token = common::token(dir.path(), "operator");

    let (_serve, url) = common::serve(
        common::command(&config, &[]),
        &["--listen", "127.0.0.1:0"],
        Stdio::null(),
    );
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    let mut samples = Vec::with_capacity(TRIALS);
    let mut from_request = Vec::with_capacity(TRIALS);
    let mut mismatches = 0;
    for _ in 0..TRIALS {
        let run_id = client_runtime.block_on(async {
            let answer = http
                .post(format!("{url}/v1/runs"))
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .body(json!({"agent": "a", "prompt": "go", "mode": "queued"}).to_string())
                .send()
                .await
                .unwrap();
            let run: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
            run["run_id"].as_str().unwrap().to_string()
        });
        // Wait until a worker of the server has the tool call on the wire.
        server_runtime.block_on(async {
            loop {
                let request = mcp.next_request(WAIT).await;
                if String::from_utf8_lossy(&request.body).contains("tools/call") {
                    break;
                }
            }
        });
        let (sent, answered) = client_runtime.block_on(async {
            let sent = Instant::now();
            let answer = http
                .post(format!("{url}/v1/runs/{run_id}/cancel"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            let at = Instant::now();
            assert!(answer.status().is_success());
            (sent, at)
        });
        let closed = server_runtime.block_on(async {
            loop {
                match mcp.next(WAIT).await {
                    Seen::Closed(at) => return at,
                    _ => continue,
                }
            }
        });
        // The server wakes the call before it writes its answer, so the close may come
        // first: then this figure is 0.
        samples.push(closed.saturating_duration_since(answered));
        from_request.push(closed.saturating_duration_since(sent));
        let status = client_runtime.block_on(async {
            let answer = http
                .get(format!("{url}/v1/runs/{run_id}"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&answer.bytes().await.unwrap()).unwrap()
        });
        if status["status"] != "cancelled" || status["pending_effect"] != "non_idempotent_write" {
            mismatches += 1;
        }
    }
    let (answered_dist, request_dist) = (Dist::new(samples), Dist::new(from_request));
    let (p50, p99, max) = (
        answered_dist.pct(50.0),
        answered_dist.pct(99.0),
        answered_dist.max(),
    );
    let (r50, r99) = (request_dist.pct(50.0), request_dist.pct(99.0));
    if json_output {
        println!(
            "{}",
            json!({"figure": "api cancel to close", "trials": TRIALS, "p50_ms": p50.as_secs_f64() * 1e3,
                   "p99_ms": p99.as_secs_f64() * 1e3, "max_ms": max.as_secs_f64() * 1e3, "mismatches": mismatches})
        );
        println!(
            "{}",
            json!({"figure": "api cancel request sent to close", "trials": TRIALS,
                   "p50_ms": r50.as_secs_f64() * 1e3, "p99_ms": r99.as_secs_f64() * 1e3})
        );
    } else {
        println!(
            "cancel through the API while the tool call is on the wire ({TRIALS} trials, runwarden serve on 127.0.0.1)"
        );
        println!("from the API answering the cancel to the MCP server seeing the close:");
        println!(
            "  p50 {:.2} ms   p99 {:.2} ms   max {:.2} ms   ({mismatches} runs not cancelled with their fence)",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
        println!(
            "from sending the cancel request to the close: p50 {:.2} ms   p99 {:.2} ms",
            r50.as_secs_f64() * 1e3,
            r99.as_secs_f64() * 1e3
        );
    }
}
