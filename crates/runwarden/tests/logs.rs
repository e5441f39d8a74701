//! O5: `--log-format json` writes one JSON object per log line: one per API request (method,
//! route template, status, duration, token name), one per cancel with its actor, one per
//! worker claim; none of them holds a secret or a token's value.

use std::time::Instant;

use runwarden_testkit::{TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::serve::install;
use crate::support::{Live, SIGIL, runwarden};

async fn named_token(
    sandbox: &std::sync::Arc<crate::support::Sandbox>,
    role: &str,
    name: &str,
) -> String {
    let created = runwarden(
        sandbox,
        &["--json", "token", "create", "--role", role, "--name", name],
    )
    .await
    .ok()
    .json();
    created["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_name_each_request_by_route_and_token_and_each_cancel_by_its_actor() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let alice = named_token(&sandbox, "operator", "alice").await;
    let mut command = sandbox.command(&[
        "--json",
        "--log-format",
        "json",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--concurrency",
        "0",
    ]);
    command.env("RUNWARDEN_LOG", "info");
    let mut serve = Live::spawn(command);
    let ready = serve.json().await;
    let base = ready["url"].as_str().unwrap().to_string();
    let http = reqwest::Client::new();

    // No worker here (concurrency 0): the run stays queued until alice cancels it.
    let started: Value = http
        .post(format!("{base}/v1/runs"))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .body(json!({"agent": "b", "prompt": "hi"}).to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .map(|body| serde_json::from_str(&body).unwrap())
        .unwrap();
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let cancelled = http
        .post(format!("{base}/v1/runs/{run_id}/cancel"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 200);
    let refused = http
        .get(format!("{base}/v1/runs/{run_id}?secret={SIGIL}"))
        .bearer_auth("rwt_forged")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    serve.signal("TERM");
    let ended = serve
        .ended(Instant::now(), std::time::Duration::from_secs(30))
        .await;
    // Log lines are JSON; the notices serve prints for the person at the terminal
    // ("stopping: ...") are not log lines.
    let lines: Vec<Value> = ended
        .stderr
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let requests: Vec<&Value> = lines.iter().filter(|l| l["message"] == "request").collect();
    let cancel = requests
        .iter()
        .find(|l| l["route"] == "/v1/runs/{id}/cancel")
        .unwrap_or_else(|| panic!("a line for the cancel request: {lines:#?}"));
    assert_eq!(cancel["method"], "POST");
    assert_eq!(cancel["status"], 200);
    assert_eq!(cancel["token"], "alice");
    assert!(cancel["duration_ms"].as_f64().is_some(), "{cancel}");
    assert_eq!(cancel["target"], "runwarden::http");
    let forged = requests
        .iter()
        .find(|l| l["status"] == 401)
        .expect("a line for the refused request");
    assert_eq!(
        forged["route"], "/v1/runs/{id}",
        "the template, never the path or query"
    );
    assert_eq!(forged["token"], "-");
    let actor = lines
        .iter()
        .find(|l| l["message"] == "run cancelled")
        .expect("a line for the cancel");
    assert_eq!(actor["run"], run_id.as_str());
    assert_eq!(actor["actor"], "alice");
    assert_eq!(actor["previous"], "queued");

    let all = ended.stderr.join("\n");
    for secret in [SIGIL, alice.as_str(), "rwt_forged"] {
        assert!(!all.contains(secret), "the log holds {secret:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_format_comes_from_the_configuration_and_a_bad_one_is_named() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    std::fs::write(
        sandbox.config(),
        format!("{text}\n[log]\nformat = \"json\"\n"),
    )
    .unwrap();
    let mut command = sandbox.command(&["mcp", "health"]);
    // The noisiest level, on a call that places the server's bearer secret (the sigil).
    command.env("RUNWARDEN_LOG", "trace");
    // Off the runtime's threads, so the MCP server keeps answering.
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.trim().is_empty(), "trace logging printed something");
    assert!(!stderr.contains(SIGIL), "a placed secret reached the log");
    for line in stderr.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }

    std::fs::write(
        sandbox.config(),
        format!("{text}\n[log]\nformat = \"xml\"\n"),
    )
    .unwrap();
    runwarden(&sandbox, &["mcp", "list"])
        .await
        .fails()
        .says("[log] format: unknown log format \"xml\": use \"text\" or \"json\"");
}
