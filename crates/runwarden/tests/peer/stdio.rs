//! Local servers through the binary: the official Python SDK's stdio server added with
//! `mcp add NAME -- COMMAND`, listed with its transport and sandbox, imported, called, and
//! gone with runwarden when runwarden is killed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{Live, Sandbox, runwarden};

/// The stdio peer's program and its script.
fn peer() -> (String, String) {
    let (python, mut args) = runwarden_testkit::stdio_peer();
    (python, args.remove(0))
}

/// How long a test waits for an event before failing.
const WAIT: Duration = Duration::from_secs(20);

/// The events the peer wrote to `path` (one word or `pid N` per line).
fn events(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits (polling every 20 ms, at most `WAIT`) for an event that `matches`.
async fn wait_for(path: &Path, matches: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(event) = events(path).into_iter().find(|e| matches(e)) {
            return event;
        }
        assert!(
            Instant::now() < deadline,
            "no such event within {WAIT:?}: {:?}",
            events(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sandbox with the local server `local` added through `mcp add`, its events at the
/// returned path.
async fn added(sandbox: &std::sync::Arc<Sandbox>) -> PathBuf {
    let events = sandbox.path().join("peer-events");
    let env = format!("PEER_EVENTS={}", events.display());
    runwarden(
        sandbox,
        &[
            "mcp",
            "add",
            "local",
            "--env",
            &env,
            "--",
            &peer().0,
            &peer().1,
        ],
    )
    .await
    .ok()
    .says("added MCP server local");
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_server_is_added_listed_imported_and_called() {
    let sandbox = std::sync::Arc::new(Sandbox::initialised());
    added(&sandbox).await;
    let config = std::fs::read_to_string(sandbox.config()).unwrap();
    assert!(
        config.contains("[mcp.servers.local]\ncommand = "),
        "{config}"
    );
    let listed = runwarden(&sandbox, &["--json", "mcp", "list", "local"])
        .await
        .ok()
        .json();
    assert_eq!(listed[0]["transport"], "stdio", "{listed}");
    assert_eq!(listed[0]["sandbox"], "namespace", "{listed}");
    runwarden(&sandbox, &["mcp", "list", "local"])
        .await
        .ok()
        .says("local stdio `")
        .says(", sandbox namespace (default effect");
    runwarden(&sandbox, &["mcp", "import", "local"])
        .await
        .ok()
        .says("imported 11 tools from local (0 refused)");
    let called = runwarden(
        &sandbox,
        &[
            "--json",
            "mcp",
            "call",
            "local",
            "local__echo",
            "--args",
            r#"{"text":"hi"}"#,
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(called["outcome"], "succeeded", "{called}");
    assert_eq!(called["text"], "hi", "{called}");
    let health = runwarden(&sandbox, &["--json", "mcp", "health"])
        .await
        .ok()
        .json();
    assert_eq!(health[0]["up"], true, "{health}");
    let audit = runwarden(&sandbox, &["--json", "audit", "list"])
        .await
        .ok()
        .json();
    let hosts = audit.to_string();
    assert!(hosts.contains("\"stdio:local\""), "{audit}");
    runwarden(&sandbox, &["audit", "verify"]).await.ok();
    let doctor = runwarden(&sandbox, &["doctor"]).await;
    assert!(
        doctor
            .stdout
            .contains("sandbox: the kernel gives local servers their namespaces (local)"),
        "{doctor:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_runwarden_kills_its_local_server_and_what_it_started() {
    let sandbox = std::sync::Arc::new(Sandbox::initialised());
    let events = added(&sandbox).await;
    let live = Live::start(
        &sandbox,
        &[
            "mcp",
            "call",
            "local",
            "stubborn",
            "--args",
            r#"{"seconds":60,"with_child":true}"#,
        ],
    );
    wait_for(&events, |e| e == "stubborn_started").await;
    // The server and the program it started in a session of its own, by the host's pids
    // (inside its sandbox the server is pid 1).
    let marker = format!("PEER_EVENTS={}", events.display());
    let started = runwarden_testkit::pids_with_env(&marker);
    assert!(started.len() >= 2, "{started:?}");
    let killed = Instant::now();
    live.signal("KILL");
    let deadline = Instant::now() + WAIT;
    loop {
        let left = runwarden_testkit::pids_with_env(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left:?} outlived runwarden (of {started:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(killed.elapsed() < WAIT);
}

/// A run of a scripted agent that calls the local server's `slow` and is cancelled by an
/// operator: the handler sees the cancel, the run ends cancelled, the call uncertain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_cancel_of_a_run_reaches_the_local_servers_handler() {
    use crate::support::workers::{config_with_short_leases, enqueue, status};

    let sandbox = Sandbox::initialised();
    let events_at = sandbox.path().join("peer-events");
    let mut text = config_with_short_leases(&sandbox);
    text.push_str(&format!(
        "\n[mcp.servers.local]\ncommand = {:?}\nargs = [{:?}]\nenv = {{ PEER_EVENTS = {:?} }}\neffect = \"read_only\"\n\n[agents.helper]\nprovider = \"scripted\"\nscript = \"helper.json\"\ntools = [\"local__echo\", \"local__slow\"]\n",
        peer().0,
        peer().1,
        events_at.display().to_string()
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let plan = serde_json::json!([
        {"tool_calls": [{"name": "local__echo", "arguments": {"text": "first"}}]},
        {"tool_calls": [{"name": "local__slow", "arguments": {"seconds": 60}}]},
        {"text": "done"}
    ]);
    std::fs::write(sandbox.path().join("helper.json"), plan.to_string()).unwrap();
    let sandbox = std::sync::Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "local"]).await.ok();
    let mut worker = Live::worker(&sandbox, None);
    let run_id = enqueue(&sandbox, "helper", "go slowly").await;
    wait_for(&events_at, |e| e == "slow_started").await;
    let cancelled = Instant::now();
    runwarden(&sandbox, &["cancel", &run_id]).await.ok();
    wait_for(&events_at, |e| e == "slow_cancelled").await;
    let seen = cancelled.elapsed();
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "cancelled", "{outcome:#}");
    assert!(
        seen < Duration::from_secs(5),
        "the handler saw the cancel {seen:?} later"
    );
    assert_eq!(status(&sandbox, &run_id).await["status"], "cancelled");
}

/// A local server that writes its secret to stderr and into its answer: runwarden's log
/// and the call's output hold `[redacted]`, never the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_a_local_server_writes_back_never_reaches_the_log_or_the_output() {
    let sandbox = std::sync::Arc::new(Sandbox::initialised());
    let sigil = "sigil-stdio-stderr-7d3e90";
    sandbox.put("local-token", sigil).ok();
    runwarden(
        &sandbox,
        &[
            "mcp",
            "add",
            "local",
            "--env-secret",
            "LOCAL_TOKEN=local-token",
            "--",
            &peer().0,
            &peer().1,
        ],
    )
    .await
    .ok();
    let mut command = sandbox.command(&[
        "--json",
        "mcp",
        "call",
        "local",
        "shout",
        "--args",
        r#"{"name":"LOCAL_TOKEN"}"#,
    ]);
    command.env("RUNWARDEN_LOG", "info");
    let shouted = sandbox.run_command(command).ok();
    assert!(!shouted.stderr.contains(sigil), "{}", shouted.stderr);
    assert!(
        shouted
            .stderr
            .contains("the value of LOCAL_TOKEN is [redacted]"),
        "{}",
        shouted.stderr
    );
    let echoed = runwarden(
        &sandbox,
        &[
            "--json",
            "mcp",
            "call",
            "local",
            "env_value",
            "--args",
            r#"{"name":"LOCAL_TOKEN"}"#,
        ],
    )
    .await
    .ok();
    assert!(!echoed.stdout.contains(sigil), "{}", echoed.stdout);
    assert!(echoed.stdout.contains("[redacted]"), "{}", echoed.stdout);
}

/// With `lifetime = "run"` each run gets a process of its own, stopped when the run ends
/// while the worker goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_server_that_lives_one_run_starts_and_stops_with_each_run() {
    use crate::support::workers::{config_with_short_leases, enqueue};

    let sandbox = Sandbox::initialised();
    let events_at = sandbox.path().join("peer-events");
    let mut text = config_with_short_leases(&sandbox);
    text.push_str(&format!(
        "\n[mcp.servers.local]\ncommand = {:?}\nargs = [{:?}]\nenv = {{ PEER_EVENTS = {:?} }}\nlifetime = \"run\"\neffect = \"read_only\"\n\n[agents.helper]\nprovider = \"scripted\"\nscript = \"helper.json\"\ntools = [\"local__echo\"]\n",
        peer().0,
        peer().1,
        events_at.display().to_string()
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let plan = serde_json::json!([
        {"tool_calls": [{"name": "local__echo", "arguments": {"text": "hello"}}]},
        {"text": "done"}
    ]);
    std::fs::write(sandbox.path().join("helper.json"), plan.to_string()).unwrap();
    let sandbox = std::sync::Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "local"]).await.ok();
    let starts = || {
        events(&events_at)
            .iter()
            .filter(|e| e.starts_with("pid "))
            .count()
    };
    assert_eq!(starts(), 1, "the import's");
    let marker = format!("PEER_EVENTS={}", events_at.display());
    let mut worker = Live::worker(&sandbox, None);
    for run in 1..=2 {
        let run_id = enqueue(&sandbox, "helper", "say hello").await;
        let (outcome, _) = worker.outcome_of(&run_id).await;
        assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
        assert_eq!(starts(), 1 + run, "one process per run");
        // The worker lives on; the run's process does not.
        let deadline = Instant::now() + WAIT;
        while !runwarden_testkit::pids_with_env(&marker).is_empty() {
            assert!(Instant::now() < deadline, "run {run}'s server outlived it");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
