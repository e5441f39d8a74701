//! Against a real peer: the official Python MCP SDK (pinned in tests/peer/requirements.txt)
//! serving Streamable HTTP on 127.0.0.1. Never skipped: a missing venv is a failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_mcp::{
    McpClient, ProtocolPolicy, Reply, Request, ServerConfig, ToolOutcome, build_catalogue,
};
use runwarden_testkit::Peer;
use runwarden_vault::CancelFlag;
use runwarden_vault::audit::action;
use serde_json::{Value, json};

pub(crate) use crate::support::call;
use crate::support::{WAIT, fixture};

pub(crate) fn stats(peer: &Peer) -> Value {
    peer.stats_json()
}

/// Waits, with a deadline, until the peer's counters satisfy `done`. The peer handles a
/// notification after answering 202, so its counters move a moment later.
pub(crate) async fn wait_for_stats(peer: &Peer, done: impl Fn(&Value) -> bool) -> Value {
    peer.wait_for_stats(WAIT, done).await
}

async fn start(flags: &'static [&'static str]) -> Peer {
    tokio::task::spawn_blocking(move || Peer::start(flags))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_real_peer_imports_with_local_names_and_usable_schemas() {
    let peer = start(&[]).await;
    let f = fixture().await;
    let server = ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake);
    let client = McpClient::new(server.clone(), f.egress.clone());
    let Ok(Reply::Tools(tools)) = client.send_request(Request::ListTools, None).await else {
        panic!("discovery failed")
    };
    let catalogue = build_catalogue(&server, &tools, 0);
    let mut names: Vec<(&str, &str)> = catalogue
        .iter()
        .map(|e| (e.local_name.as_str(), e.remote_name.as_str()))
        .collect();
    names.sort();
    assert!(
        names.contains(&("peer__files_read", "files.read")),
        "{names:?}"
    );
    assert!(names.contains(&("peer__echo", "echo")), "{names:?}");
    // Every peer schema normalises; the one tool that only runs as a task is refused.
    assert!(
        catalogue
            .iter()
            .all(|e| e.is_usable() != (e.remote_name == "long_job")),
        "every peer schema normalises: {catalogue:#?}"
    );
}

#[tokio::test]
async fn the_real_peer_answers_calls_and_is_error_is_a_failed_result() {
    let peer = start(&[]).await;
    let f = fixture().await;
    let client = McpClient::new(
        ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    );
    let echoed = client
        .call_tool(call("echo", json!({"text": "hello"})), None)
        .await;
    assert_eq!(
        (echoed.result.outcome, echoed.result.text.as_str()),
        (ToolOutcome::Succeeded, "hello")
    );
    let added = client
        .call_tool(call("add", json!({"a": 2, "b": 3})), None)
        .await;
    assert_eq!(added.result.text, "5");
    let failed = client
        .call_tool(call("fail", json!({"message": "boom"})), None)
        .await;
    assert_eq!(
        (failed.result.outcome, failed.result.text.as_str()),
        (ToolOutcome::ToolError, "boom")
    );
}

#[tokio::test]
async fn a_stateless_json_peer_works_without_a_session() {
    let peer = start(&["--stateless", "--json-response"]).await;
    let f = fixture().await;
    let client = McpClient::new(
        ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    );
    assert!(
        matches!(client.send_request(Request::ListTools, None).await, Ok(Reply::Tools(t)) if !t.is_empty())
    );
    let echoed = client
        .call_tool(call("echo", json!({"text": "hi"})), None)
        .await;
    assert_eq!(echoed.result.text, "hi");
}

#[tokio::test]
async fn a_slow_tool_cancelled_mid_call_ends_promptly_and_the_server_stops_it() {
    let peer = start(&[]).await;
    let f = fixture().await;
    let client = Arc::new(McpClient::new(
        ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    ));
    let flag = CancelFlag::new();
    let (task_client, task_flag) = (client.clone(), flag.clone());
    let task = tokio::spawn(async move {
        task_client
            .call_tool(call("slow", json!({"seconds": 30.0})), Some(&task_flag))
            .await
    });
    wait_for_stats(&peer, |s| s["slow_started"] == 1).await;

    let cancelled_at = Instant::now();
    flag.cancel();
    let outcome = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    // Generous bound (the cancel itself takes milliseconds; the notice is bounded at 2 s).
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(3),
        "took {:?}",
        cancelled_at.elapsed()
    );
    assert_eq!(outcome.result.outcome, ToolOutcome::Cancelled);
    assert!(outcome.result.text.contains("cancelled"));

    let after = wait_for_stats(&peer, |s| {
        s["cancel_notifications"] == 1 && s["slow_cancelled"] == 1
    })
    .await;
    assert_eq!(after["slow_completed"], 0, "the server stopped the work");
    let actions: Vec<String> = f.audit_actions().await;
    assert!(
        actions.contains(&action::HTTP_CALL_CANCELLED.to_string()),
        "{actions:?}"
    );
    assert_eq!(
        actions.last().map(String::as_str),
        Some(action::HTTP_CALL),
        "the notice is audited too"
    );
}
