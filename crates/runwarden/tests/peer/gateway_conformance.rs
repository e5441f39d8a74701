//! The official MCP conformance suite's server scenarios (`@modelcontextprotocol/conformance`
//! 0.2.0-alpha.12, installed by `scripts/conformance.sh`) against the gateway, with the
//! TypeScript "everything" server behind it as a local server. The suite sends no token,
//! so it reaches the gateway through a proxy on 127.0.0.1 that adds one.
//!
//! The gateway serves tools only, under their local names (`everything__echo`), so the
//! scenarios that call the suite's own fixtures by name, or read resources and prompts,
//! cannot pass; the pass count is printed like the client's. The scenarios in [`MUST_PASS`]
//! must pass, and any other that starts passing is reported, so the list can grow.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;

use crate::support::serve::{Serve, named_token};
use crate::support::{Sandbox, runwarden};

/// The suite version the gateway is measured with (the newer of the client's two).
const VERSION: &str = "0.2.0-alpha.12";

/// The scenarios the gateway must pass.
const MUST_PASS: &[&str] = &[
    "server-initialize",
    "server-session-lifecycle",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-error",
    "server-sse-multiple-streams",
];

fn suite_dir() -> PathBuf {
    runwarden_testkit::required_path(
        "RUNWARDEN_CONFORMANCE_DIR",
        "the official MCP conformance suite (with Node 22)",
        "scripts/conformance.sh",
    )
}

/// A proxy on 127.0.0.1 that sends every request on to `upstream` with
/// `Authorization: Bearer token` added, and streams the answer back; its URL.
async fn bearer_proxy(upstream: String, token: String) -> String {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let forward = move |request: Request| {
        let (http, upstream, token) = (http.clone(), upstream.clone(), token.clone());
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 24)
                .await
                .unwrap_or_default();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let mut outgoing = http
                .request(parts.method.clone(), format!("{upstream}{path}"))
                .bearer_auth(&token)
                .body(body);
            for (name, value) in &parts.headers {
                if name != "content-length" && name != "authorization" {
                    outgoing = outgoing.header(name, value);
                }
            }
            let Ok(answer) = outgoing.send().await else {
                return Response::builder().status(502).body(Body::empty()).unwrap();
            };
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                if name != "content-length" && name != "transfer-encoding" {
                    response = response.header(name, value);
                }
            }
            let chunks = futures_util::stream::unfold(answer, |mut answer| async move {
                match answer.chunk().await {
                    Ok(Some(chunk)) => Some((Ok::<_, std::io::Error>(chunk), answer)),
                    _ => None,
                }
            });
            response.body(Body::from_stream(chunks)).unwrap()
        }
    };
    let app = axum::Router::new().fallback(forward);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Every server scenario `list` names.
fn server_scenarios(node: &Path, entry: &Path) -> Vec<String> {
    let output = Command::new(node).arg(entry).arg("list").output().unwrap();
    assert!(output.status.success(), "conformance list failed");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    text.split("Server scenarios")
        .nth(1)
        .expect("a server section")
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with("  - "))
        .filter(|line| !line.contains("[extension]") && !line.contains("[2026-07-28]"))
        .map(|line| {
            let line = line.trim_start_matches("  - ");
            line.split_once(" [")
                .map_or(line, |(name, _)| name)
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suites_server_scenarios_run_against_the_gateway() {
    let dir = suite_dir();
    let node = dir.join("node/bin/node");
    let entry = dir.join(format!(
        "suite-{VERSION}/node_modules/@modelcontextprotocol/conformance/dist/index.js"
    ));
    let everything =
        dir.join("everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let sandbox = Sandbox::initialised();
    sandbox.append_config(&format!(
        "\n[mcp.servers.everything]\ncommand = {:?}\nargs = [{:?}, \"stdio\"]\neffect = \"read_only\"\n\n[gateway.tokens.suite]\ntools = [\"everything__*\"]\n",
        node.display().to_string(),
        everything.display().to_string(),
    ));
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "everything"])
        .await
        .ok();
    let token = named_token(&sandbox, "operator", "suite").await;
    let serve = Serve::start(&sandbox, 1).await;
    let proxy = bearer_proxy(serve.url(), token).await;

    let results = tempfile::tempdir().unwrap();
    let scenarios = server_scenarios(&node, &entry);
    let mut passed = Vec::new();
    for scenario in &scenarios {
        let output = tokio::process::Command::new(&node)
            .arg(&entry)
            .args([
                "server",
                "--url",
                &format!("{proxy}/mcp"),
                "--scenario",
                scenario,
            ])
            .args(["--timeout", "30000", "-o"])
            .arg(results.path())
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        let ok = output.status.success() && text.contains(", 0 failed");
        println!("  {:<6} {scenario}", if ok { "pass" } else { "FAIL" });
        if !ok && (MUST_PASS.contains(&scenario.as_str()) || scenario == "dns-rebinding-protection")
        {
            let said = text.lines().filter(|l| !l.trim().is_empty()).take(12);
            println!("{}", said.collect::<Vec<_>>().join("\n"));
            println!("{}", String::from_utf8_lossy(&output.stderr));
        }
        if ok {
            passed.push(scenario.clone());
        }
    }
    println!(
        "conformance {VERSION}: {} of {} server scenarios passed through the gateway",
        passed.len(),
        scenarios.len()
    );
    for name in MUST_PASS {
        assert!(
            passed.iter().any(|p| p == name),
            "{name} must pass: {passed:?}"
        );
    }
}
