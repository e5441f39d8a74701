//! M13 and M15 through the binary, against the real peer (the official Python SDK): every
//! command ends the MCP session it opened with DELETE, and a run turns the server's
//! progress and log notifications into throttled, bounded events.

use std::sync::Arc;

use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::{Sandbox, runwarden};

async fn peer() -> Peer {
    tokio::task::spawn_blocking(|| Peer::start(&[]))
        .await
        .unwrap()
}

fn deletes(peer: &Peer) -> u64 {
    let stats: Value = serde_json::from_str(&peer.get("/wire-stats")).unwrap();
    assert_eq!(
        stats["deletes"], stats["delete_statuses"]["200"],
        "every DELETE ended a live session: {stats}"
    );
    stats["deletes"].as_u64().unwrap()
}

/// A sandbox with server `peer` and agent `a` replaying `plan` with its tools.
fn sandbox(peer: &Peer, plan: Value) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.peer]\nurl = \"{}\"\neffect = \"read_only\"\n# These tests are about the 2025-11-25 session wire (M13-M16).\nprotocol = \"2025-11-25\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"peer__*\"]\n",
        peer.url()
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("plan.json"), plan.to_string()).unwrap();
    Arc::new(sandbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_import_mcp_call_and_run_each_end_their_session_with_delete() {
    let peer = peer().await;
    let plan = json!([
        {"tool_calls": [{"name": "peer__echo", "arguments": {"text": "hi"}}]},
        {"text": "done"}
    ]);
    let sandbox = sandbox(&peer, plan);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    assert_eq!(deletes(&peer), 1, "mcp import");
    runwarden(
        &sandbox,
        &["mcp", "call", "peer", "echo", "--args", r#"{"text":"x"}"#],
    )
    .await
    .ok()
    .says("x");
    assert_eq!(deletes(&peer), 2, "mcp call");
    runwarden(&sandbox, &["run", "--agent", "a", "go"])
        .await
        .ok()
        .says("completed");
    assert_eq!(deletes(&peer), 3, "run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_progress_and_logs_become_throttled_bounded_run_events() {
    let peer = peer().await;
    let plan = json!([
        {"tool_calls": [{"name": "peer__progress", "arguments": {"steps": 25, "delay": 0.06}}]},
        {"text": "done"}
    ]);
    let sandbox = sandbox(&peer, plan);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    let out = runwarden(&sandbox, &["run", "--agent", "a", "go"])
        .await
        .ok()
        .says("completed");
    let run_id = out
        .stderr
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let events = runwarden(&sandbox, &["--json", "events", &run_id])
        .await
        .ok()
        .stdout;
    let events: Vec<Value> = events
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &str| -> Vec<&Value> { events.iter().filter(|e| e["kind"] == kind).collect() };
    // M15: 25 notifications over ~1.5 s, written at most twice a second.
    let progress = of("tool_progress");
    assert!(
        (1..=5).contains(&progress.len()),
        "throttled progress: {progress:#?}"
    );
    let first = &progress[0]["payload"];
    assert_eq!(
        (first["tool"].as_str(), first["total"].as_f64()),
        (Some("peer__progress"), Some(25.0))
    );
    let progressed: Vec<f64> = progress
        .iter()
        .map(|e| e["payload"]["progress"].as_f64().unwrap())
        .collect();
    assert!(progressed.windows(2).all(|w| w[0] < w[1]), "{progressed:?}");
    // Logs: every line kept up to the per-call bound of 20.
    let logs = of("tool_log");
    assert_eq!(logs.len(), 20, "bounded per call");
    assert_eq!(logs[0]["payload"]["data"], "log line 1");
    // Nothing of the call after the step that ended it.
    let executed = events
        .iter()
        .position(|e| e["kind"] == "tool_executed")
        .unwrap();
    let last_notice = events
        .iter()
        .rposition(|e| e["kind"] == "tool_progress" || e["kind"] == "tool_log")
        .unwrap();
    assert!(last_notice < executed, "{events:#?}");
}
