//! How a synchronous `runwarden run` ends when its user goes away: SIGTERM and SIGHUP
//! cancel it as Ctrl-C does, and so does a closed standard output (`run ... | head -1`).
//! Each test holds a real `tools/call` on the wire (a stalling MCP server on 127.0.0.1)
//! and checks that the server sees the connection close, that the run ends `cancelled`
//! with its final event, and that nothing finishes it later. Errors are printed whole.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::{Live, Sandbox, call_the_stalling_tool, lines, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);
/// A cancel issued in the run's own process wakes its in-flight call at once (R6).
const IN_PROCESS: Duration = Duration::from_secs(2);

/// A sandbox admitting 127.0.0.1 with MCP server `srv` at `server` (imported) and agent
/// `a` replaying `plan` with the tools `srv__*`.
async fn scripted(server: &TestServer, plan: Value) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n",
        server.url("/mcp")
    ));
    std::fs::write(sandbox.path().join("plan.json"), plan.to_string()).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    sandbox
}

fn method(request: &HttpRequest) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    body["method"].as_str().unwrap_or_default().to_string()
}

/// Waits until the server holds a `tools/call` (it stalls those).
async fn until_tool_call_is_held(server: &mut TestServer) {
    while method(&server.next_request(WAIT).await) != "tools/call" {}
}

/// The run id in `run`'s banner on stderr.
fn run_id_of(banner: &str) -> String {
    banner
        .strip_prefix("run ")
        .and_then(|rest| rest.strip_suffix(" (Ctrl-C cancels it)"))
        .unwrap_or_else(|| panic!("the banner names the run: {banner:?}"))
        .to_string()
}

/// The run's stored events, from `runwarden --json events`.
async fn event_kinds(sandbox: &Arc<Sandbox>, run_id: &str) -> Vec<String> {
    runwarden(sandbox, &["--json", "events", run_id])
        .await
        .ok()
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// After the run's own process ended it: the row is cancelled, the log ends with one
/// final event, and a reaper pass (what a later worker or `serve` would do) leaves it
/// cancelled without calling the tool again.
async fn ended_cancelled_for_good(sandbox: &Arc<Sandbox>, server: &mut TestServer, run_id: &str) {
    let status = runwarden(sandbox, &["--json", "status", run_id])
        .await
        .ok()
        .json();
    assert_eq!(status["status"], "cancelled", "{status}");
    let kinds = event_kinds(sandbox, run_id).await;
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("run_stopped"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| runwarden_runtime::events::is_final_kind(k))
            .count(),
        1,
        "R8: one terminal event: {kinds:?}"
    );
    runwarden(sandbox, &["reap"]).await.ok();
    let status = runwarden(sandbox, &["--json", "status", run_id])
        .await
        .ok()
        .json();
    assert_eq!(
        status["status"], "cancelled",
        "nothing took the run up again"
    );
    assert!(
        server
            .drain_requests()
            .iter()
            .all(|r| method(r) != "tools/call"),
        "the write was not sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sighup_cancel_a_run_like_ctrl_c_and_close_the_call_in_flight() {
    for (signal, cause) in [("TERM", "SIGTERM"), ("HUP", "SIGHUP")] {
        let mut server = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
        let sandbox = scripted(&server, call_the_stalling_tool()).await;
        let mut run = Live::start(&sandbox, &["run", "--agent", "a", "open a ticket"]);
        let run_id = run_id_of(&run.err_line().await);
        until_tool_call_is_held(&mut server).await;

        let sent = Instant::now();
        run.signal(signal);
        let closed = server.next_close(WAIT).await;
        let ended = run.ended(sent, IN_PROCESS).await;
        assert!(
            closed.saturating_duration_since(sent) < IN_PROCESS,
            "SIG{signal}: the server saw the call close in time"
        );
        assert_eq!(ended.code, Some(130), "SIG{signal}: {ended:#?}");
        let stdout = ended.stdout.join("\n");
        assert!(
            stdout.contains(&format!("run {run_id} cancelled"))
                && stdout.contains(&format!("after {cause}")),
            "SIG{signal}: {ended:#?}"
        );
        ended_cancelled_for_good(&sandbox, &mut server, &run_id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_cancels_the_run_even_while_its_tool_call_is_on_the_wire() {
    let mut server = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = scripted(&server, call_the_stalling_tool()).await;
    let mut command = sandbox.command(&["run", "--agent", "a", "open a ticket"]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("the binary starts");
    let mut stderr = lines(child.stderr.take().unwrap());
    let banner = tokio::time::timeout(WAIT, stderr.recv())
        .await
        .expect("the banner in time")
        .expect("stderr open");
    let run_id = run_id_of(&banner);

    // `| head -1`: read one line, then go away while the call is held.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("started"), "{first}");
    until_tool_call_is_held(&mut server).await;
    let closed_at = Instant::now();
    drop(stdout);

    let closed = server.next_close(WAIT).await;
    assert!(
        closed.saturating_duration_since(closed_at) < IN_PROCESS,
        "the call in flight was torn down at once"
    );
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(130));
    let mut said = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(WAIT, stderr.recv()).await {
        said.push(line);
    }
    let said = said.join("\n");
    assert!(
        said.contains(&format!("run {run_id} cancelled"))
            && said.contains("after a closed standard output"),
        "the summary goes to stderr when stdout is gone: {said}"
    );
    ended_cancelled_for_good(&sandbox, &mut server, &run_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_error_is_printed_whole_by_run_events_and_status() {
    let tail = "the end of the reason says what to do: rotate the key named model-key";
    let message = format!(
        "{} {tail}",
        "a long explanation of what went wrong".repeat(3)
    );
    let body = json!({"error": {"message": message}}).to_string();
    let model =
        TestServer::start(move |_| HttpReply::typed(400, "application/json", body.clone())).await;
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        "\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\n",
        model.url("/v1")
    ));
    let sandbox = Arc::new(sandbox);
    let expected = format!("the model provider answered HTTP 400: {message}");
    assert!(
        expected.chars().count() > 150,
        "the reason is long enough to have been cut"
    );

    let run = runwarden(&sandbox, &["run", "--agent", "a", "hello"])
        .await
        .fails();
    let run_id = run_id_of(run.stderr.lines().next().unwrap_or_default());
    assert!(
        run.stdout
            .contains(&format!("model call failed: {expected}")),
        "{run:#?}"
    );
    assert!(
        run.stdout
            .lines()
            .any(|l| l.contains(&format!("{run_id} failed: ")) && l.contains(&expected)),
        "{run:#?}"
    );

    let events = runwarden(&sandbox, &["events", &run_id]).await.ok();
    assert!(
        events.stdout.contains(&format!("failed: {expected}")),
        "{events:#?}"
    );
    assert!(!events.stdout.contains('…'), "nothing is cut: {events:#?}");
    let status = runwarden(&sandbox, &["status", &run_id]).await.ok();
    assert!(status.stdout.contains(tail), "{status:#?}");
}
