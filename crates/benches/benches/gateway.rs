//! `tools/call` through the MCP gateway against the upstream server called directly, in one
//! run: one client calling one at a time (round trip), and 64 clients at once, each with
//! its own session (throughput). The upstream is `runwarden-testkit`'s MCP server on
//! 127.0.0.1 (answers at once); the gateway is the real release binary's `serve`, with the
//! audit on disk, each session a run and each call a recorded step. The clients speak
//! JSON-RPC over one pooled HTTP client, as an SDK does.
//!
//! Run: `cargo build --release -p runwarden && cargo bench -p runwarden-benches --bench gateway`.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_testkit::{Dist, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use common::runwarden;

const SEQUENTIAL: usize = 500;
const CLIENTS: usize = 64;
const CONCURRENT_CALLS: usize = 4_000;

/// One MCP endpoint and how to reach it: a bearer token and a session, when it has them.
#[derive(Clone)]
struct Endpoint {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    session: Option<String>,
}

impl Endpoint {
    async fn post(&self, body: &Value) -> (Option<String>, Value) {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let answer = request.send().await.expect("the endpoint answers");
        let session = answer
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = answer.text().await.expect("an answer body");
        let body = serde_json::from_str(&text).expect("a JSON answer");
        (session, body)
    }

    /// A session of its own, after `initialize`.
    async fn opened(&self) -> Self {
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}});
        let (session, answer) = self.post(&initialize).await;
        assert!(answer.get("result").is_some(), "{answer}");
        Self {
            session,
            ..self.clone()
        }
    }

    async fn call(&self, tool: &str, id: usize) {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {"q": "hello"}}});
        let (_, answer) = self.post(&call).await;
        // `isError` is absent upstream and `false` through the gateway: both are success.
        let result = &answer["result"];
        assert!(result.is_object() && result["isError"] != true, "{answer}");
    }
}

async fn sequential(endpoint: &Endpoint, tool: &str) -> Dist {
    let session = endpoint.opened().await;
    let mut samples = Vec::with_capacity(SEQUENTIAL);
    for id in 0..SEQUENTIAL {
        let started = Instant::now();
        session.call(tool, id).await;
        samples.push(started.elapsed());
    }
    Dist::new(samples)
}

async fn concurrent(endpoint: &Endpoint, tool: &'static str) -> f64 {
    let mut sessions = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        sessions.push(Arc::new(endpoint.opened().await));
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (client, session) in sessions.into_iter().enumerate() {
        let calls = CONCURRENT_CALLS / CLIENTS + usize::from(client < CONCURRENT_CALLS % CLIENTS);
        tasks.spawn(async move {
            for id in 0..calls {
                session.call(tool, id).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    CONCURRENT_CALLS as f64 / started.elapsed().as_secs_f64()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let json_output = std::env::args().any(|a| a == "--json");
    let server_runtime = common::one_thread_runtime();
    let mcp = server_runtime.block_on(TestServer::start(mcp_handler(vec![tool("echo")], &[])));

    let dir = tempfile::tempdir().unwrap();
    runwarden(dir.path(), &["init"]);
    let config = dir.path().join("runwarden.toml");
    let mut text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\nallow = []\n", "\nallow = [\"127.0.0.1\"]\n");
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\neffect = \"read_only\"\n\n[gateway.tokens.bench]\ntools = [\"srv__*\"]\n",
        mcp.url("/mcp")
    ));
    std::fs::write(&config, text).unwrap();
    runwarden(dir.path(), &["mcp", "import", "srv"]);
    let created: Value = serde_json::from_slice(
        &runwarden(
            dir.path(),
            &[
                "--json", "token", "create", "--role", "operator", "--name", "bench",
            ],
        )
        .stdout,
    )
    .unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let (_serve, url) = common::serve(
        common::command(&config, &[]),
        &["--listen", "127.0.0.1:0"],
        Stdio::null(),
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let direct = Endpoint {
        http: http.clone(),
        url: mcp.url("/mcp"),
        token: None,
        session: None,
    };
    let gateway = Endpoint {
        http,
        url: format!("{url}/mcp"),
        token: Some(token),
        session: None,
    };
    let (direct_rt, gateway_rt, direct_tput, gateway_tput) = runtime.block_on(async {
        // One warm-up pass each, so both have their connections and caches.
        sequential(&direct, "echo").await;
        sequential(&gateway, "srv__echo").await;
        let direct_rt = sequential(&direct, "echo").await;
        let gateway_rt = sequential(&gateway, "srv__echo").await;
        let direct_tput = concurrent(&direct, "echo").await;
        let gateway_tput = concurrent(&gateway, "srv__echo").await;
        (direct_rt, gateway_rt, direct_tput, gateway_tput)
    });
    let rows = [
        ("upstream called directly", &direct_rt, direct_tput),
        ("through the gateway", &gateway_rt, gateway_tput),
    ];
    for (name, dist, tput) in rows {
        if json_output {
            println!(
                "{}",
                json!({"bench": "gateway", "path": name, "p50_ms": ms(dist.pct(50.0)),
                       "p99_ms": ms(dist.pct(99.0)), "calls_per_s_64": tput})
            );
        } else {
            println!(
                "| {name} | p50 {:.2} ms | p99 {:.2} ms | {CLIENTS} clients: {tput:.0} calls/s |",
                ms(dist.pct(50.0)),
                ms(dist.pct(99.0)),
            );
        }
    }
    if !json_output {
        println!(
            "gateway overhead at p50: {:.2} ms; throughput {:.2} of direct",
            ms(gateway_rt.pct(50.0).saturating_sub(direct_rt.pct(50.0))),
            gateway_tput / direct_tput
        );
    }
}
