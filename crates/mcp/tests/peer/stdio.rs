//! Local servers over stdio: the official Python SDK's server started by the client
//! itself, without a sandbox (the sandbox has its own tests).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_mcp::stdio::{EnvValue, SandboxMode, StdioConfig};
use runwarden_mcp::{Effect, McpClient, Notice, NoticeSink, Reply, Request, ServerConfig};
use runwarden_vault::{CancelFlag, Delivery, SecretName, SecretValue};
use serde_json::json;

use crate::support::{Fixture, WAIT, call, fixture};

/// The stdio peer, unsandboxed, its events written to `events`.
fn peer(events: &Path) -> StdioConfig {
    let (python, script) = runwarden_testkit::stdio_peer();
    let mut stdio = StdioConfig::new(python, script);
    stdio.sandbox = SandboxMode::Unsandboxed;
    stdio.cancel_grace = Duration::from_millis(500);
    stdio.env.insert(
        "PEER_EVENTS".into(),
        EnvValue::Literal(events.display().to_string()),
    );
    stdio
}

fn client(f: &Fixture, stdio: StdioConfig) -> McpClient {
    McpClient::new(ServerConfig::local("local", stdio), f.egress.clone())
}

fn events(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits (polling the file every 20 ms, at most `WAIT`) until `word` is among the events.
async fn wait_for_event(path: &Path, word: &str) {
    let deadline = Instant::now() + WAIT;
    while !events(path).iter().any(|e| e == word) {
        assert!(
            Instant::now() < deadline,
            "no {word:?} event within {WAIT:?}: {:?}",
            events(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_local_server_lists_and_calls_its_tools_with_a_row_per_message() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let client = client(&f, peer(&dir.path().join("events")));
    let Reply::Tools(tools) = client.send_request(Request::ListTools, None).await.unwrap() else {
        panic!("tools expected");
    };
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"echo") && names.contains(&"slow"),
        "{names:?}"
    );
    let outcome = client
        .call_tool(call("echo", json!({"text": "hello"})), None)
        .await;
    assert!(outcome.result.error.is_none(), "{}", outcome.result.text);
    assert_eq!(outcome.result.text, "hello");
    assert_eq!(outcome.protocol.as_deref(), Some("2025-11-25"));
    let rows = f.vault.audit_list(Default::default()).await.unwrap();
    let call_rows: Vec<_> = rows
        .iter()
        .filter(|r| r.event.path == "tools/call")
        .map(|r| {
            (
                r.event.action.as_str(),
                r.event.host.as_str(),
                r.event.success,
            )
        })
        .collect();
    assert_eq!(
        call_rows,
        [
            ("stdio_call_started", "stdio:local", false),
            ("stdio_call", "stdio:local", true)
        ]
    );
    client.close().await.unwrap();
}

#[tokio::test]
async fn progress_reaches_the_caller_and_a_cancel_reaches_the_handler() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let events_at = dir.path().join("events");
    let client = Arc::new(client(&f, peer(&events_at)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let mut slow = call("slow", json!({"seconds": 30}));
    slow.notices = Some(NoticeSink::new(move |n| sink_seen.lock().unwrap().push(n)));
    let stop = Arc::new(CancelFlag::new());
    let calling = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move { client.call_tool(slow, Some(&*stop)).await })
    };
    // Cancel once the handler has reported progress: it is running.
    let deadline = Instant::now() + WAIT;
    while !seen
        .lock()
        .unwrap()
        .iter()
        .any(|n| matches!(n, Notice::Progress { .. }))
    {
        assert!(Instant::now() < deadline, "no progress within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled_at = Instant::now();
    stop.cancel();
    let outcome = tokio::time::timeout(WAIT, calling).await.unwrap().unwrap();
    let took = cancelled_at.elapsed();
    assert!(outcome.result.error.is_some(), "{}", outcome.result.text);
    assert_eq!(
        outcome.result.delivery,
        Delivery::MaybeDelivered,
        "{}",
        outcome.result.text
    );
    assert!(
        took < Duration::from_secs(1),
        "the call ended {took:?} after the cancel"
    );
    wait_for_event(&events_at, "slow_cancelled").await;
    // The server ended the call itself: the process lives on and takes the next call.
    let next = client
        .call_tool(call("echo", json!({"text": "again"})), None)
        .await;
    assert_eq!(next.result.text, "again");
    client.close().await.unwrap();
}

#[tokio::test]
async fn a_handler_that_ignores_the_cancel_is_killed_within_the_grace() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let events_at = dir.path().join("events");
    let client = Arc::new(client(&f, peer(&events_at)));
    let stop = Arc::new(CancelFlag::new());
    let calling = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            client
                .call_tool(call("stubborn", json!({"seconds": 60})), Some(&*stop))
                .await
        })
    };
    wait_for_event(&events_at, "stubborn_started").await;
    stop.cancel();
    let outcome = tokio::time::timeout(WAIT, calling).await.unwrap().unwrap();
    assert_eq!(outcome.result.delivery, Delivery::MaybeDelivered);
    // Within the 500 ms grace (and a generous margin) the process is gone and the next
    // call starts a new one.
    let started = Instant::now();
    let next = client
        .call_tool(call("echo", json!({"text": "fresh"})), None)
        .await;
    assert_eq!(next.result.text, "fresh", "{}", next.result.text);
    assert!(started.elapsed() < Duration::from_secs(10));
    client.close().await.unwrap();
}

#[tokio::test]
async fn a_server_that_dies_mid_call_leaves_the_write_uncertain_and_restarts() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let mut stdio = peer(&dir.path().join("events"));
    stdio.cancel_grace = Duration::from_millis(200);
    let mut server = ServerConfig::local("local", stdio);
    server.effect = Effect::NonIdempotentWrite;
    let client = McpClient::new(server, f.egress.clone());
    let outcome = client.call_tool(call("crash", json!({})), None).await;
    assert!(outcome.result.error.is_some(), "{}", outcome.result.text);
    assert_eq!(
        outcome.result.delivery,
        Delivery::MaybeDelivered,
        "{}",
        outcome.result.text
    );
    assert!(
        outcome.result.text.contains("status 3"),
        "{}",
        outcome.result.text
    );
    let next = client
        .call_tool(call("echo", json!({"text": "back"})), None)
        .await;
    assert_eq!(next.result.text, "back", "{}", next.result.text);
    client.close().await.unwrap();
}

#[tokio::test]
async fn the_server_sees_only_its_configured_environment_and_no_secret_leaks_back() {
    let f = fixture().await;
    let sigil = "sigil-stdio-env-6f1c2b";
    let name = SecretName::new("local-token").unwrap();
    f.vault
        .secret_put(&name, SecretValue::new(sigil.as_bytes().to_vec()))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut stdio = peer(&dir.path().join("events"));
    stdio
        .env
        .insert("LOCAL_TOKEN".into(), EnvValue::Secret(name));
    stdio
        .env
        .insert("GREETING".into(), EnvValue::Literal("hi".into()));
    let client = client(&f, stdio);
    let listed = client.call_tool(call("env", json!({})), None).await;
    let names: Vec<&str> = listed.result.text.lines().collect();
    // Python adds LC_CTYPE itself on some systems; nothing of runwarden's passes on.
    let ours: Vec<&str> = names.iter().copied().filter(|n| *n != "LC_CTYPE").collect();
    assert_eq!(
        ours,
        ["GREETING", "LOCAL_TOKEN", "PATH", "PEER_EVENTS"],
        "{names:?}"
    );
    let value = client
        .call_tool(call("env_value", json!({"name": "LOCAL_TOKEN"})), None)
        .await;
    assert!(!value.result.text.contains(sigil), "{}", value.result.text);
    assert!(
        value.result.text.contains("[redacted]"),
        "{}",
        value.result.text
    );
    // One row says which secrets went into its environment, never their values.
    let rows = f.vault.audit_list(Default::default()).await.unwrap();
    let placed: Vec<_> = rows
        .iter()
        .filter(|r| r.event.action == "environment_placed")
        .collect();
    assert_eq!(placed.len(), 1, "{rows:#?}");
    assert_eq!(placed[0].event.secret.as_deref(), Some("local-token"));
    assert_eq!(placed[0].event.host, "stdio:local");
    assert!(!format!("{rows:?}").contains(sigil));
    client.close().await.unwrap();
}

/// The TypeScript "everything" server over stdio, from `RUNWARDEN_CONFORMANCE_DIR`
/// (`scripts/conformance.sh` installs it beside Node 22), unsandboxed.
fn everything() -> StdioConfig {
    let dir = PathBuf::from(std::env::var_os("RUNWARDEN_CONFORMANCE_DIR").expect(
        "RUNWARDEN_CONFORMANCE_DIR is not set: run scripts/conformance.sh and set it to the path it prints last",
    ));
    let node = dir.join("node/bin/node").display().to_string();
    let server = dir
        .join("everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string();
    let mut stdio = StdioConfig::new(node, vec![server, "stdio".into()]);
    stdio.sandbox = SandboxMode::Unsandboxed;
    stdio.cancel_grace = Duration::from_millis(300);
    stdio
}

#[tokio::test]
async fn the_typescript_everything_server_lists_calls_reports_progress_and_is_cancelled() {
    let f = fixture().await;
    let client = Arc::new(client(&f, everything()));
    let Reply::Tools(tools) = client.send_request(Request::ListTools, None).await.unwrap() else {
        panic!("tools expected");
    };
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"echo") && names.contains(&"get-sum"),
        "{names:?}"
    );
    let echoed = client
        .call_tool(call("echo", json!({"message": "hi"})), None)
        .await;
    assert!(echoed.result.text.contains("hi"), "{}", echoed.result.text);
    let summed = client
        .call_tool(
            call("get-structured-content", json!({"location": "Chicago"})),
            None,
        )
        .await;
    assert!(summed.result.structured.is_some(), "{}", summed.result.text);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let mut long = call(
        "trigger-long-running-operation",
        json!({"duration": 1, "steps": 4}),
    );
    long.notices = Some(NoticeSink::new(move |n| sink_seen.lock().unwrap().push(n)));
    let done = client.call_tool(long, None).await;
    assert!(done.result.error.is_none(), "{}", done.result.text);
    let progress = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|n| matches!(n, Notice::Progress { .. }))
        .count();
    assert_eq!(progress, 4, "{:?}", seen.lock().unwrap());

    // A cancel: the call ends at once, uncertain; the server (which does not answer a
    // cancelled call) is stopped after the grace, and the next call starts it again.
    let stop = Arc::new(CancelFlag::new());
    let (first, mut progressed) = tokio::sync::mpsc::unbounded_channel();
    let calling = {
        let (client, stop) = (client.clone(), stop.clone());
        let mut long = call(
            "trigger-long-running-operation",
            json!({"duration": 30, "steps": 30}),
        );
        long.notices = Some(NoticeSink::new(move |n| {
            let _ = first.send(n);
        }));
        tokio::spawn(async move { client.call_tool(long, Some(&*stop)).await })
    };
    // Cancel once the handler has reported progress: it is running.
    tokio::time::timeout(WAIT, progressed.recv()).await.unwrap();
    let cancelled_at = Instant::now();
    stop.cancel();
    let outcome = tokio::time::timeout(WAIT, calling).await.unwrap().unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(1));
    assert_eq!(
        outcome.result.delivery,
        Delivery::MaybeDelivered,
        "{}",
        outcome.result.text
    );
    let again = client
        .call_tool(call("echo", json!({"message": "again"})), None)
        .await;
    assert!(again.result.text.contains("again"), "{}", again.result.text);
    client.close().await.unwrap();
}
