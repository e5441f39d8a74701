//! The cost of observability (O5), side by side in one run:
//!
//! 1. `tools/call` through the vault and the MCP client inside a `tool_call` span, as the
//!    executor makes it: no subscriber, the default log subscriber (warn, nothing written),
//!    and the OpenTelemetry layer exporting every span over OTLP/HTTP to a receiver on
//!    127.0.0.1. Rounds interleave the variants so drift hits each alike.
//! 2. An API request (`GET /v1/runs/{id}`) to a real `runwarden serve`: the default log
//!    (nothing per request) and `--log-format json` at `RUNWARDEN_LOG=info` (one JSON line
//!    per request, written to a file).
//!
//! Run: `cargo bench -p runwarden-benches --bench telemetry [-- --calls N]`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use runwarden_benches as _;
use runwarden_mcp::{McpCall, McpClient, ServerConfig};
use runwarden_testkit::{
    Dist, LoopbackVault, OtlpReceiver, TestServer, loopback_vault, mcp_handler, tool,
};
use serde_json::{Value, json};
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

use common::{KillOnDrop, one_thread_runtime, runwarden};

const ROUNDS: usize = 10;

fn main() {
    let calls: usize = std::env::args()
        .skip_while(|a| a != "--calls")
        .nth(1)
        .map_or(2000, |n| n.parse().expect("--calls takes a number"));
    tool_calls(calls);
    api_requests(calls);
}

/// One dispatcher per variant; `None` is no subscriber at all.
fn variants(
    endpoint: &str,
) -> (
    Vec<(&'static str, tracing::Dispatch)>,
    opentelemetry_sdk::trace::SdkTracerProvider,
) {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .build()
        .expect("the exporter builds");
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    let otel = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("bench")));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::sink)
        .finish();
    (
        vec![
            ("no subscriber", tracing::Dispatch::none()),
            (
                "log subscriber at warn (the default)",
                tracing::Dispatch::new(logs),
            ),
            (
                "OpenTelemetry exporting every span",
                tracing::Dispatch::new(otel),
            ),
        ],
        provider,
    )
}

fn tool_calls(calls: usize) {
    let servers = one_thread_runtime();
    let (mcp, mut receiver) = servers.block_on(async {
        let mcp = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
        (mcp, OtlpReceiver::start().await)
    });
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (vault, client) = client_runtime.block_on(async {
        let vault = loopback_vault().await;
        let client = Arc::new(McpClient::new(
            ServerConfig::new("bench", mcp.url("/mcp")),
            vault.egress.clone(),
        ));
        (vault, client)
    });
    let LoopbackVault { dir: _dir, .. } = vault;
    let (variants, provider) = variants(&receiver.endpoint());
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let per_round = (calls / ROUNDS).max(1);
    for _ in 0..ROUNDS {
        for (i, (_, dispatch)) in variants.iter().enumerate() {
            tracing::dispatcher::with_default(dispatch, || {
                client_runtime.block_on(async {
                    for _ in 0..per_round {
                        let started = Instant::now();
                        let call = McpCall {
                            tool: "echo".into(),
                            arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
                            ..Default::default()
                        };
                        let outcome = client
                            .call_tool(call, None)
                            .instrument(tracing::info_span!("tool_call", tool = "echo"))
                            .await;
                        assert!(
                            outcome.result.text.contains("hello"),
                            "{:?}",
                            outcome.result
                        );
                        samples[i].push(started.elapsed());
                    }
                });
            });
        }
    }
    let _ = provider.shutdown();
    let exported = servers.block_on(async { receiver.spans().len() });
    println!(
        "tools/call through the vault, {} calls per variant ({exported} spans exported):",
        per_round * ROUNDS
    );
    println!("{:<40} {:>10} {:>10}", "variant", "p50", "p99");
    for ((name, _), samples) in variants.iter().zip(samples) {
        let d = Dist::new(samples);
        println!("{name:<40} {:>10.1?} {:>10.1?}", d.pct(50.0), d.pct(99.0));
    }
}

/// A `serve` of the installation in `dir`, writing its log to `log`.
fn serve(dir: &std::path::Path, json_logs: bool, log: &std::path::Path) -> (KillOnDrop, String) {
    let mut command = common::command(&dir.join("runwarden.toml"), &[]);
    if json_logs {
        command
            .args(["--log-format", "json"])
            .env("RUNWARDEN_LOG", "info");
    }
    common::serve(
        command,
        &["--listen", "127.0.0.1:0", "--concurrency", "0"],
        std::fs::File::create(log).unwrap(),
    )
}

fn api_requests(requests: usize) {
    let dir = tempfile::tempdir().unwrap();
    runwarden(dir.path(), &["init"]);
    let config = dir.path().join("runwarden.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(&config, text).unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    let token = common::token(dir.path(), "viewer");
    let run: Value = serde_json::from_slice(
        &runwarden(dir.path(), &["--json", "enqueue", "--agent", "a", "x"]).stdout,
    )
    .unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let (_plain, plain_url) = serve(dir.path(), false, &dir.path().join("plain.log"));
    let (_json, json_url) = serve(dir.path(), true, &dir.path().join("json.log"));
    let runtime = one_thread_runtime();
    let names = [
        "default log (nothing per request)",
        "--log-format json at info",
    ];
    let urls = [plain_url, json_url];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); 2];
    runtime.block_on(async {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let per_round = (requests / ROUNDS).max(1);
        for _ in 0..ROUNDS {
            for (i, url) in urls.iter().enumerate() {
                for _ in 0..per_round {
                    let started = Instant::now();
                    let answer = http
                        .get(format!("{url}/v1/runs/{run_id}"))
                        .bearer_auth(&token)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(answer.status(), 200);
                    let _ = answer.bytes().await.unwrap();
                    samples[i].push(started.elapsed());
                }
            }
        }
    });
    let lines = std::fs::read_to_string(dir.path().join("json.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"request\""))
        .count();
    println!("\nGET /v1/runs/{{id}} to a real serve ({lines} JSON request lines written):");
    println!("{:<40} {:>10} {:>10}", "variant", "p50", "p99");
    for (name, samples) in names.iter().zip(samples) {
        let d = Dist::new(samples);
        println!("{name:<40} {:>10.1?} {:>10.1?}", d.pct(50.0), d.pct(99.0));
    }
}
