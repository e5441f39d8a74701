//! `runwarden run`, `cancel`, `status` and `events` against a real MCP server and an
//! OpenAI-compatible model server on 127.0.0.1: a full run persisted step by step, and an
//! operator's cancel (from another process, or Ctrl-C) tearing down a call on the wire.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpReply, HttpRequest, Seen, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::{Live, SIGIL, Sandbox, call_the_stalling_tool, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);
/// A cancel from another process reaches an in-flight call by polling the row, at most once
/// a second (R6); this bound is generous on purpose.
const CROSS_PROCESS: Duration = Duration::from_secs(5);
/// A cancel issued in the run's own process wakes its in-flight call at once (R6).
const IN_PROCESS: Duration = Duration::from_secs(1);

/// An initialised sandbox that admits 127.0.0.1, with `toml` appended to its config.
fn sandbox(toml: &str) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(toml);
    std::fs::write(sandbox.config(), text).unwrap();
    Arc::new(sandbox)
}

/// A sandbox with MCP server `srv` at `server` (its tools imported, each with the default
/// effect, a non-idempotent write) and agent `a` replaying `plan` with the tools `srv__*`.
async fn scripted(server: &TestServer, plan: Value) -> Arc<Sandbox> {
    let sandbox = sandbox(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n",
        server.url("/mcp")
    ));
    std::fs::write(sandbox.path().join("plan.json"), plan.to_string()).unwrap();
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    sandbox
}

/// A sandbox with agent `a` talking to an OpenAI-compatible server at `base_url`.
fn openai(base_url: &str, extra: &str) -> Arc<Sandbox> {
    sandbox(&format!(
        "\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{base_url}\"\n{extra}\n"
    ))
}

/// A plan that creates a ticket, then answers.
fn create_then_answer() -> Value {
    json!([
        {"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]},
        {"text": "Ticket created."}
    ])
}

/// One JSON object per stdout line.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The run's persisted events, from `runwarden --json events`.
async fn events(sandbox: &Arc<Sandbox>, run_id: &str) -> Vec<Value> {
    json_lines(
        &runwarden(sandbox, &["--json", "events", run_id])
            .await
            .ok()
            .stdout,
    )
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

/// The JSON-RPC method a request to the MCP server carried.
fn method(request: &HttpRequest) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    body["method"].as_str().unwrap_or_default().to_string()
}

/// Waits until the server holds a `tools/call` (it stalls those), returning every request
/// it saw up to and including that one.
async fn until_tool_call_is_held(server: &mut TestServer) -> Vec<HttpRequest> {
    let mut seen = Vec::new();
    loop {
        let request = server.next_request(WAIT).await;
        let is_call = method(&request) == "tools/call";
        seen.push(request);
        if is_call {
            return seen;
        }
    }
}

/// Waits until the client closes the stalled connection, keeping the requests seen meanwhile.
async fn until_closed(server: &mut TestServer, within: Duration, seen: &mut Vec<HttpRequest>) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, server.events.recv())
            .await
            .expect("the server saw the stalled connection close in time")
            .expect("the test server stopped");
        match next {
            Seen::Request(_, request) => seen.push(request),
            Seen::Closed(_) => return,
            Seen::Connected(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_calls_the_tool_and_completes_printing_each_step() {
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = scripted(&server, create_then_answer()).await;
    server.drain_requests();

    let out = runwarden(&sandbox, &["run", "--agent", "a", "open a ticket"])
        .await
        .ok()
        .says("completed");
    let banner = out.stderr.lines().next().unwrap_or_default();
    let run_id = banner
        .strip_prefix("run ")
        .and_then(|rest| rest.strip_suffix(" (Ctrl-C cancels it)"))
        .unwrap_or_else(|| panic!("stderr starts with the run's id: {out:#?}"));
    let steps = [
        "[1] started: agent a",
        "[2] round 1: model asked for srv__create",
        "[3] round 1: tool srv__create succeeded: create {\"q\":\"printer\"}",
        "[4] round 2: model answered: Ticket created.",
        "[5] completed: Ticket created.",
        &format!("run {run_id} completed"),
    ];
    let mut from = 0;
    for step in steps {
        let at = out.stdout[from..]
            .find(step)
            .unwrap_or_else(|| panic!("{step:?} after byte {from} of stdout: {out:#?}"));
        from += at + step.len();
    }

    let calls: Vec<Value> = server
        .drain_requests()
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "one tools/call reached the server");
    assert_eq!(calls[0]["params"]["name"], "create");
    assert_eq!(calls[0]["params"]["arguments"], json!({"q": "printer"}));

    let events = events(&sandbox, run_id).await;
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "model_response",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(events[2]["payload"]["outcome"], "succeeded");
    assert_eq!(events[2]["payload"]["effect"], "non_idempotent_write");

    let status = runwarden(&sandbox, &["--json", "status", run_id])
        .await
        .ok()
        .json();
    assert_eq!(status["status"], "completed");
    assert_eq!(status["rounds"], 2);
    assert_eq!(
        status["pending_effect"],
        Value::Null,
        "recording the write step cleared the fence (R7)"
    );
    assert_eq!(status["termination_reason"], "Ticket created.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_json_prints_one_object_per_event_each_with_the_run_id() {
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = scripted(&server, create_then_answer()).await;

    let out = runwarden(
        &sandbox,
        &["--json", "run", "--agent", "a", "open a ticket"],
    )
    .await
    .ok();
    assert!(out.stderr.trim().is_empty(), "nothing on stderr: {out:#?}");
    let objects = json_lines(&out.stdout);
    assert_eq!(objects.len(), 6, "five events and a summary: {out:#?}");
    let run_id = objects[0]["run_id"].as_str().unwrap().to_string();
    for object in &objects {
        assert!(object.is_object());
        assert_eq!(object["run_id"], run_id.as_str(), "{object}");
    }
    let (live, summary) = objects.split_at(5);
    assert_eq!(
        kinds(live),
        [
            "run_started",
            "model_response",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
    assert_eq!(
        summary[0],
        json!({"run_id": run_id, "outcome": "completed", "status": "completed",
               "termination_reason": "Ticket created.", "pending_effect": null,
               "usage": {"input_tokens": 0, "output_tokens": 0}})
    );
    // What was printed as it happened is what was persisted. The time is left out: the
    // live line is stamped when it is printed, not with the stored event's time.
    let without_time = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .map(|e| {
                let mut e = e.clone();
                e.as_object_mut().unwrap().remove("time");
                e
            })
            .collect()
    };
    let stored = events(&sandbox, &run_id).await;
    assert_eq!(without_time(live), without_time(&stored));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_from_another_process_tears_down_a_stalled_write_and_keeps_the_fence() {
    let mut server = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = scripted(&server, call_the_stalling_tool()).await;

    let mut run = Live::start(
        &sandbox,
        &["--json", "run", "--agent", "a", "open a ticket"],
    );
    let started = run.json().await;
    assert_eq!(started["kind"], "run_started");
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let mut seen = until_tool_call_is_held(&mut server).await;

    runwarden(&sandbox, &["cancel", &run_id])
        .await
        .ok()
        .says(&format!("cancelled run {run_id} (it was running)"));
    let cancelled = Instant::now();
    until_closed(&mut server, CROSS_PROCESS, &mut seen).await;
    let ended = run.ended(cancelled, CROSS_PROCESS).await;
    assert_eq!(ended.code, Some(130), "{ended:#?}");
    let summary: Value = serde_json::from_str(ended.stdout.last().unwrap()).unwrap();
    assert_eq!(summary["outcome"], "cancelled");
    assert_eq!(summary["pending_effect"], "non_idempotent_write");

    let events = events(&sandbox, &run_id).await;
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "model_response",
            "effect_uncertain",
            "run_stopped"
        ]
    );
    let step = &events[2]["payload"];
    assert_eq!(step["outcome"], "cancelled", "{step}");
    assert!(
        step["text"].as_str().unwrap().contains("cancelled"),
        "M12: the tool result says cancelled: {step}"
    );
    assert_eq!(events[3]["payload"]["outcome"], "cancelled");

    let audit = runwarden(
        &sandbox,
        &["--json", "audit", "list", "--action", "http_call_cancelled"],
    )
    .await
    .ok()
    .json();
    let rows = audit.as_array().unwrap();
    assert_eq!(rows.len(), 1, "one torn-down call: {audit}");
    assert_eq!(rows[0]["correlation"], run_id.as_str());

    let status = runwarden(&sandbox, &["--json", "status", &run_id])
        .await
        .ok()
        .json();
    assert_eq!(status["status"], "cancelled");
    assert_eq!(
        status["pending_effect"], "non_idempotent_write",
        "R7: the cancellation branch keeps the fence"
    );

    // Nothing retried the write; the only later message is the cancellation notice (M4).
    seen.extend(server.drain_requests());
    let calls: Vec<Value> = seen
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "exactly one tools/call in total");
    let notices: Vec<Value> = seen
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
        .filter(|m| m["method"] == "notifications/cancelled")
        .collect();
    assert_eq!(notices.len(), 1, "M4: one cancellation notice");
    assert_eq!(notices[0]["params"]["requestId"], calls[0]["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_from_another_process_tears_down_a_stalled_model_call() {
    let mut model = TestServer::start(|_| HttpReply::Stall).await;
    let sandbox = openai(&model.url("/v1"), "");

    let mut run = Live::start(&sandbox, &["--json", "run", "--agent", "a", "think hard"]);
    let started = run.json().await;
    assert_eq!(started["kind"], "run_started");
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let request = model.next_request(WAIT).await;
    assert_eq!(
        (request.method.as_str(), request.target.as_str()),
        ("POST", "/v1/chat/completions")
    );

    runwarden(&sandbox, &["cancel", &run_id])
        .await
        .ok()
        .says("cancelled run");
    let cancelled = Instant::now();
    model.next_close(CROSS_PROCESS).await;
    let ended = run.ended(cancelled, CROSS_PROCESS).await;
    assert_eq!(ended.code, Some(130), "{ended:#?}");

    let events = events(&sandbox, &run_id).await;
    assert_eq!(
        kinds(&events),
        ["run_started", "model_cancelled", "run_stopped"]
    );
    let audit = runwarden(
        &sandbox,
        &["--json", "audit", "list", "--action", "http_call_cancelled"],
    )
    .await
    .ok()
    .json();
    let rows = audit.as_array().unwrap();
    assert_eq!(rows.len(), 1, "one torn-down model call: {audit}");
    assert_eq!(rows[0]["correlation"], run_id.as_str());
    assert_eq!(rows[0]["path"], "/v1/chat/completions");

    let status = runwarden(&sandbox, &["--json", "status", &run_id])
        .await
        .ok()
        .json();
    assert_eq!(status["status"], "cancelled");
    assert_eq!(
        status["pending_effect"],
        Value::Null,
        "a model call is no write"
    );
    assert_eq!(
        model.drain_requests().len(),
        0,
        "the model call was not retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_on_run_cancels_through_the_operator_path() {
    let mut server = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = scripted(&server, call_the_stalling_tool()).await;

    let mut run = Live::start(&sandbox, &["run", "--agent", "a", "open a ticket"]);
    let banner = run.err_line().await;
    let run_id = banner
        .strip_prefix("run ")
        .and_then(|rest| rest.strip_suffix(" (Ctrl-C cancels it)"))
        .unwrap_or_else(|| panic!("the banner names the run: {banner:?}"))
        .to_string();
    until_tool_call_is_held(&mut server).await;

    let pressed = Instant::now();
    run.signal("INT");
    let ended = run.ended(pressed, IN_PROCESS).await;
    assert_eq!(ended.code, Some(130), "{ended:#?}");
    let stdout = ended.stdout.join("\n");
    assert!(
        stdout.contains(&format!("run {run_id} cancelled")) && stdout.contains("after Ctrl-C"),
        "{ended:#?}"
    );
    assert!(
        stdout.contains("non_idempotent_write was in flight"),
        "{ended:#?}"
    );
    server.next_close(WAIT).await;

    let status = runwarden(&sandbox, &["--json", "status", &run_id])
        .await
        .ok()
        .json();
    assert_eq!(status["status"], "cancelled", "the row was cancelled (R4)");
    assert_eq!(status["pending_effect"], "non_idempotent_write");
    // The same path as an operator's cancel: the row is terminal, so a second cancel is refused.
    runwarden(&sandbox, &["cancel", &run_id])
        .await
        .fails()
        .says("already cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_finished_or_unknown_run_is_refused_clearly() {
    let sandbox = sandbox("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(
        sandbox.path().join("plan.json"),
        json!([{"text": "nothing to do"}]).to_string(),
    )
    .unwrap();
    let out = runwarden(&sandbox, &["--json", "run", "--agent", "a", "hello"])
        .await
        .ok();
    let run_id = json_lines(&out.stdout)[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();

    runwarden(&sandbox, &["cancel", &run_id])
        .await
        .fails()
        .says(&format!("run {run_id} is already completed"));
    let status = runwarden(&sandbox, &["--json", "status", &run_id])
        .await
        .ok()
        .json();
    assert_eq!(status["status"], "completed", "the refusal changed nothing");

    let unknown = "01890000-0000-7000-8000-000000000000";
    runwarden(&sandbox, &["cancel", unknown])
        .await
        .fails()
        .says(&format!("no run with id {unknown}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_streams_a_live_run_until_it_ends() {
    let mut server = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = scripted(&server, call_the_stalling_tool()).await;

    let mut run = Live::start(
        &sandbox,
        &["--json", "run", "--agent", "a", "open a ticket"],
    );
    let run_id = run.json().await["run_id"].as_str().unwrap().to_string();
    until_tool_call_is_held(&mut server).await;

    let mut follow = Live::start(&sandbox, &["--json", "events", &run_id, "--follow"]);
    let mut streamed = vec![follow.json().await, follow.json().await];
    assert_eq!(kinds(&streamed), ["run_started", "model_response"]);
    assert!(
        !follow.has_exited(),
        "--follow waits while the run is still running"
    );

    runwarden(&sandbox, &["cancel", &run_id]).await.ok();
    let cancelled = Instant::now();
    let ended = follow.ended(cancelled, CROSS_PROCESS).await;
    assert_eq!(ended.code, Some(0), "{ended:#?}");
    streamed.extend(json_lines(&ended.stdout.join("\n")));
    assert_eq!(
        kinds(&streamed),
        [
            "run_started",
            "model_response",
            "effect_uncertain",
            "run_stopped"
        ]
    );
    let seqs: Vec<u64> = streamed
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4], "each event streamed once, in order");
    assert_eq!(streamed[2]["payload"]["outcome"], "cancelled");
    assert_eq!(run.ended(cancelled, CROSS_PROCESS).await.code, Some(130));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_of_a_model_never_appears_in_output() {
    let mut model = TestServer::start(|_| {
        HttpReply::typed(
            200,
            "application/json",
            json!({"choices": [{"message": {"role": "assistant", "content": "done"}}]}).to_string(),
        )
    })
    .await;
    let sandbox = openai(&model.url("/v1"), "api_key_secret = \"model-key\"");
    let mut outputs = vec![sandbox.put("model-key", SIGIL)];

    let mut command = sandbox.command(&["run", "--agent", "a", "say done"]);
    // Every log line at every level must be clean too.
    command.env("RUNWARDEN_LOG", "trace");
    let sandbox2 = sandbox.clone();
    let out = tokio::task::spawn_blocking(move || sandbox2.run_command(command))
        .await
        .unwrap()
        .ok()
        .says("completed");
    let run_id = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.strip_suffix(" (Ctrl-C cancels it)"))
        .unwrap_or_else(|| panic!("the banner names the run: {out:#?}"))
        .to_string();
    outputs.push(out);

    // The key reached the server, in its placement: the checks below are not vacuous.
    let request = model.next_request(WAIT).await;
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {SIGIL}").as_str())
    );

    outputs.push(runwarden(&sandbox, &["events", &run_id]).await.ok());
    outputs.push(
        runwarden(&sandbox, &["--json", "events", &run_id])
            .await
            .ok(),
    );
    outputs.push(runwarden(&sandbox, &["status", &run_id]).await.ok());
    outputs.push(
        runwarden(&sandbox, &["--json", "status", &run_id])
            .await
            .ok(),
    );
    let audit = runwarden(&sandbox, &["--json", "audit", "list", "--run", &run_id])
        .await
        .ok();
    let rows = audit.json();
    assert_eq!(rows[0]["action"], "http_call");
    assert_eq!(
        rows[0]["secret"], "model-key",
        "V7: the audit row names the secret, never its value"
    );
    outputs.push(audit);
    outputs.push(runwarden(&sandbox, &["audit", "list"]).await.ok());
    for output in &outputs {
        assert!(
            !output.all().contains(SIGIL),
            "the key leaked into the output of {}",
            output.args
        );
    }
}
