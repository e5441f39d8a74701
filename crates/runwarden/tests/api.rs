//! `runwarden serve` over real HTTP on 127.0.0.1: tokens and roles, every error code,
//! pagination, the live event stream resumed from `Last-Event-ID`, a cancel through the
//! API tearing down a call on the wire, the metrics it leaves, and a graceful stop.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpRequest, Seen, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::serve::{Api, Serve, SseReader, install, token};
use crate::support::{Output, SIGIL, Sandbox, call_the_stalling_tool, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);
/// A cancel through the API wakes the run's in-flight call in the same process (R6).
const IN_PROCESS: Duration = Duration::from_secs(1);

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_roles_decide_who_may_read_start_and_cancel() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    // Text mode prints the token alone on stdout, the note on stderr.
    let created = runwarden(&sandbox, &["token", "create", "--role", "viewer"])
        .await
        .ok();
    let viewer = created.stdout.trim().to_string();
    assert!(
        viewer.starts_with("rwt_") && !viewer.contains(' '),
        "{created:?}"
    );
    assert!(created.stderr.contains("shown once"), "{created:?}");
    let operator = token(&sandbox, "operator").await;
    let listed = runwarden(&sandbox, &["--json", "token", "list"]).await.ok();
    assert_eq!(listed.json().as_array().unwrap().len(), 2);
    assert!(
        !listed.stdout.contains(&viewer) && !listed.stdout.contains(&operator),
        "a token is never listed"
    );
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);

    let (status, body) = api.call("GET", "/v1/runs", None, None).await;
    assert_eq!((status, code(&body)), (401, "unauthorized"), "{body}");
    let (status, _) = api.call("GET", "/v1/runs", Some("rwt_forged"), None).await;
    assert_eq!(status, 401);
    assert_eq!(api.call("GET", "/healthz", None, None).await.0, 200);
    assert_eq!(api.call("GET", "/readyz", None, None).await.0, 200);

    let start = json!({"agent": "b", "prompt": "hi"}).to_string();
    let (status, body) = api
        .call("POST", "/v1/runs", Some(&viewer), Some(start.clone()))
        .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let (status, run) = api
        .call("POST", "/v1/runs", Some(&operator), Some(start))
        .await;
    assert_eq!(status, 202, "{run}");
    let id = run["run_id"].as_str().unwrap();
    assert_eq!(api.get(&format!("/v1/runs/{id}"), &viewer).await, run);
    let cancel = format!("/v1/runs/{id}/cancel");
    let (status, body) = api.call("POST", &cancel, Some(&viewer), None).await;
    assert_eq!((status, code(&body)), (403, "forbidden"));
    let (status, body) = api.call("POST", &cancel, Some(&operator), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"run_id": id, "cancelled": true, "previous": "queued"})
    );

    // CLI and API agree on a run.
    let status = runwarden(&sandbox, &["--json", "status", id])
        .await
        .ok()
        .json();
    assert_eq!(api.get(&format!("/v1/runs/{id}"), &viewer).await, status);

    // The served document is the one in the repository.
    let response = reqwest::Client::new()
        .get(format!("{}/v1/openapi.json", serve.url))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    let served = response.text().await.unwrap();
    let file = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json"),
    )
    .unwrap();
    assert_eq!(served, file);

    // A revoked token is refused from then on.
    let id = runwarden(&sandbox, &["--json", "token", "list"])
        .await
        .ok()
        .json()[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    runwarden(&sandbox, &["token", "revoke", &id]).await.ok();
    let (status, _) = api.call("GET", "/v1/runs", Some(&viewer), None).await;
    assert_eq!(status, 401);
    api.assert_no_sigil();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_comes_in_one_shape_over_http() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let operator = token(&sandbox, "operator").await;
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);
    let op = Some(operator.as_str());
    let big = json!({"agent": "b", "prompt": "x".repeat(70 * 1024)}).to_string();
    let sync = json!({"agent": "b", "prompt": "hi", "mode": "sync"}).to_string();
    let (status, done) = api.call("POST", "/v1/runs", op, Some(sync)).await;
    assert_eq!(
        (status, &done["status"]),
        (200, &json!("completed")),
        "{done}"
    );
    let done_id = done["run_id"].as_str().unwrap();
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("GET", "/v1/runs".into(), None, 200, ""),
        (
            "POST",
            "/v1/runs".into(),
            Some("{\"agent\":".into()),
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/runs".into(),
            Some(json!({"agent": "b", "prompt": "p", "priority": 1}).to_string()),
            400,
            "unknown_field",
        ),
        (
            "POST",
            "/v1/runs".into(),
            Some(json!({"prompt": "p"}).to_string()),
            400,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/runs".into(),
            Some(json!({"agent": "zed", "prompt": "p"}).to_string()),
            404,
            "agent_not_found",
        ),
        ("POST", "/v1/runs".into(), Some(big), 413, "body_too_large"),
        (
            "GET",
            "/v1/runs?status=odd".into(),
            None,
            400,
            "invalid_request",
        ),
        ("GET", "/v1/runs/none".into(), None, 404, "run_not_found"),
        (
            "POST",
            "/v1/runs/none/cancel".into(),
            None,
            404,
            "run_not_found",
        ),
        (
            "POST",
            format!("/v1/runs/{done_id}/cancel"),
            None,
            409,
            "run_already_terminal",
        ),
        ("GET", "/v2/anything".into(), None, 404, "not_found"),
        ("PUT", "/v1/runs".into(), None, 405, "method_not_allowed"),
        (
            "DELETE",
            "/v1/audit".into(),
            None,
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, body, status, expected) in cases {
        let (got, answer) = api.call(method, &path, op, body).await;
        assert_eq!(got, status, "{method} {path}: {answer}");
        if status != 200 {
            assert_eq!(code(&answer), expected, "{method} {path}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "{answer}");
            assert_eq!(answer.as_object().unwrap().len(), 1, "one shape: {answer}");
        }
    }
    api.assert_no_sigil();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_runs_cover_every_run_once_newest_first() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let operator = token(&sandbox, "operator").await;
    let viewer = token(&sandbox, "viewer").await;
    let serve = Serve::start(&sandbox, 0).await; // no workers: the runs stay queued
    let api = Api::new(&serve);
    let mut created = Vec::new();
    for i in 0..7 {
        let body = json!({"agent": "b", "prompt": format!("p{i}")}).to_string();
        let (status, run) = api
            .call("POST", "/v1/runs", Some(&operator), Some(body))
            .await;
        assert_eq!(status, 202, "{run}");
        assert_eq!(run["status"], "queued");
        created.push(run["run_id"].as_str().unwrap().to_string());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/v1/runs?limit=3&status=queued&agent=b".to_string(),
            Some(c) => format!("/v1/runs?limit=3&status=queued&agent=b&cursor={c}"),
        };
        let page = api.get(&path, &viewer).await;
        pages += 1;
        let runs = page["runs"].as_array().unwrap();
        assert!(runs.len() <= 3, "{page}");
        seen.extend(
            runs.iter()
                .map(|r| r["run_id"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert_eq!(
                    Some(next),
                    seen.last().map(String::as_str),
                    "the cursor is the last id"
                );
                cursor = Some(next.to_string());
            }
            None => break,
        }
        assert!(pages < 10, "the pages end");
    }
    assert_eq!(pages, 3, "7 runs in pages of 3");
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first, "every run once, newest first");
    let none = api.get("/v1/runs?status=completed", &viewer).await;
    assert_eq!(none, json!({"runs": [], "next_cursor": null}));
    let other = api.get("/v1/runs?agent=a", &viewer).await;
    assert_eq!(other["runs"].as_array().unwrap().len(), 0);
}

/// The JSON-RPC method a request to the MCP server carried.
fn method(request: &HttpRequest) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    body["method"].as_str().unwrap_or_default().to_string()
}

/// Waits until the MCP server holds a `tools/call` (it stalls those).
async fn until_tool_call_is_held(server: &mut TestServer) {
    while method(&server.next_request(WAIT).await) != "tools/call" {}
}

/// Waits until the client closes the stalled connection; answers when it saw it.
async fn until_closed(server: &mut TestServer, within: Duration) -> Instant {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, server.events.recv())
            .await
            .expect("the MCP server saw the stalled connection close in time")
            .expect("the test server stopped");
        if let Seen::Closed(_) = next {
            return Instant::now();
        }
    }
}

/// The id of the one running run. Callers wait until its tool call is held first: a run
/// is `running` from its creation or claim on, so one read finds it.
async fn the_running_run(api: &Api, viewer: &str) -> String {
    let page = api.get("/v1/runs?status=running", viewer).await;
    page["runs"][0]["run_id"]
        .as_str()
        .expect("a run is running while its tool call is held")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_of_a_live_run_resumes_from_last_event_id_without_gaps_or_duplicates() {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = install(&mcp, call_the_stalling_tool()).await;
    mcp.drain_requests();
    let operator = token(&sandbox, "operator").await;
    let viewer = token(&sandbox, "viewer").await;
    let serve = Serve::start(&sandbox, 1).await; // a worker in the server claims the run
    let api = Api::new(&serve);
    let body = json!({"agent": "a", "prompt": "open a ticket"}).to_string();
    let (status, run) = api
        .call("POST", "/v1/runs", Some(&operator), Some(body))
        .await;
    assert_eq!(status, 202, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_string();

    // The first connection reads the first event of the live run, then goes away.
    let mut first = SseReader::open(&api, &run_id, &viewer, None).await;
    let started = first.next().await.expect("the first event");
    assert_eq!((started.id, started.kind.as_str()), (1, "run_started"));
    assert_eq!(started.data["seq"], 1);
    assert_eq!(started.data["run_id"], run_id.as_str());
    drop(first);
    until_tool_call_is_held(&mut mcp).await;

    // The second resumes after it, sees the rest while the call stalls, then the cancel.
    let mut second = SseReader::open(&api, &run_id, &viewer, Some(started.id)).await;
    let asked = second.next().await.expect("the model's turn");
    assert_eq!((asked.id, asked.kind.as_str()), (2, "model_response"));
    let (status, cancelled) = api
        .call(
            "POST",
            &format!("/v1/runs/{run_id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["previous"], "running");
    until_closed(&mut mcp, IN_PROCESS).await;
    let mut rest = Vec::new();
    while let Some(event) = second.next().await {
        rest.push(event);
    }
    let kinds: Vec<&str> = rest.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["effect_uncertain", "run_stopped"], "{rest:#?}");
    let ids: Vec<i64> = [started.id, asked.id]
        .into_iter()
        .chain(rest.iter().map(|e| e.id))
        .collect();
    assert_eq!(ids, [1, 2, 3, 4], "no gap and no duplicate");
    assert_eq!(rest[0].data["payload"]["outcome"], "cancelled");

    // The stream agrees with the JSON form and with the CLI.
    let stored = api.get(&format!("/v1/runs/{run_id}/events"), &viewer).await;
    let stored = stored["events"].as_array().unwrap().clone();
    let streamed: Vec<Value> = [started, asked]
        .into_iter()
        .chain(rest)
        .map(|e| e.data)
        .collect();
    assert_eq!(stored, streamed);
    let cli = runwarden(&sandbox, &["--json", "events", &run_id])
        .await
        .ok();
    let cli: Vec<Value> = cli
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(cli, stored);
    // A stream opened after the end replays what is left and ends at once.
    let mut late = SseReader::open(&api, &run_id, &viewer, Some(3)).await;
    assert_eq!(late.next().await.map(|e| e.id), Some(4));
    assert_eq!(late.next().await, None);
    api.assert_no_sigil();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_the_api_ends_a_sync_run_whose_call_is_in_flight() {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = install(&mcp, call_the_stalling_tool()).await;
    mcp.drain_requests();
    let operator = token(&sandbox, "operator").await;
    let viewer = token(&sandbox, "viewer").await;
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);

    let body = json!({"agent": "a", "prompt": "open a ticket", "mode": "sync"}).to_string();
    let (client, op) = (api.clone(), operator.clone());
    let sync =
        tokio::spawn(async move { client.call("POST", "/v1/runs", Some(&op), Some(body)).await });
    until_tool_call_is_held(&mut mcp).await;
    let run_id = the_running_run(&api, &viewer).await;

    let (status, cancelled) = api
        .call(
            "POST",
            &format!("/v1/runs/{run_id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    let answered = Instant::now();
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(
        cancelled,
        json!({"run_id": run_id, "cancelled": true, "previous": "running"})
    );
    let closed = until_closed(&mut mcp, IN_PROCESS).await;
    assert!(closed.duration_since(answered) < IN_PROCESS);
    let (status, run) = tokio::time::timeout(WAIT, sync)
        .await
        .expect("the sync request returns")
        .unwrap();
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["run_id"], run_id.as_str());
    assert_eq!(run["status"], "cancelled");
    assert_eq!(
        run["pending_effect"], "non_idempotent_write",
        "R7: the fence stays"
    );

    // The metrics: runs by status, calls by action, one cancel latency observation.
    let response = reqwest::Client::new()
        .get(format!("{}/metrics", serve.url))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let metrics = response.text().await.unwrap();
    for line in [
        "runwarden_db_runs{status=\"cancelled\"} 1",
        "runwarden_db_runs{status=\"running\"} 0",
        "runwarden_db_audit_rows{action=\"http_call_cancelled\"} 1",
        // This process's own count of the same call, with how far it got.
        "runwarden_outbound_calls_total{action=\"http_call_cancelled\",delivery=\"maybe_delivered\"} 1",
        "runwarden_cancel_latency_seconds_count 1",
        "runwarden_cancel_latency_seconds_bucket{le=\"+Inf\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    let under_a_second = metrics
        .lines()
        .find(|l| l.starts_with("runwarden_cancel_latency_seconds_bucket{le=\"1.0\"}"))
        .unwrap_or_default();
    assert!(under_a_second.ends_with(" 1"), "{metrics}");

    // The audit rows and the server's tools and liveness, as the CLI has them.
    let audit = api
        .get(
            &format!("/v1/audit?action=http_call_cancelled&run={run_id}"),
            &viewer,
        )
        .await;
    let rows = audit["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{audit}");
    assert_eq!(rows[0]["secret"], "srv-token");
    let cli = runwarden(
        &sandbox,
        &[
            "--json",
            "audit",
            "list",
            "--action",
            "http_call_cancelled",
            "--run",
            &run_id,
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(audit["rows"], cli);
    let verify = api.get("/v1/audit/verify", &viewer).await;
    assert_eq!(verify["intact"], true, "{verify}");
    let servers = api.get("/v1/mcp/servers", &viewer).await;
    let cli = runwarden(&sandbox, &["--json", "mcp", "list"])
        .await
        .ok()
        .json();
    assert_eq!(servers["servers"], cli);
    let tools: BTreeSet<&str> = servers["servers"][0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["local_name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, BTreeSet::from(["srv__stall"]));
    assert!(
        servers["servers"][0]["last_success"].is_string(),
        "{servers}"
    );
    api.assert_no_sigil();
    assert!(!metrics.contains(SIGIL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_gracefully() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let mut serve = Serve::start(&sandbox, 1).await;
    let api = Api::new(&serve);
    assert_eq!(api.call("GET", "/healthz", None, None).await.0, 200);
    serve.signal("TERM");
    let stopped = tokio::time::timeout(WAIT, serve.stdout.recv())
        .await
        .expect("the stop line in time")
        .expect("serve printed its stop line");
    let stopped: Value = serde_json::from_str(&stopped).unwrap();
    assert_eq!(stopped["stopped"], true, "{stopped}");
    assert_eq!(stopped["drained"], true, "{stopped}");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = serve.child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "serve did not exit");
        // A std `Child` offers no exit event to await without blocking a runtime thread;
        // serve already printed its stop line, so this bounded poll ends within a few ticks.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the CLI once on the store and once through the server; answers both outputs.
async fn both_ways(
    sandbox: &Arc<Sandbox>,
    serve: &Serve,
    token: &str,
    args: &[&str],
) -> (Output, Output) {
    let on_store = runwarden(sandbox, args).await;
    let mut command = sandbox.command(args);
    command
        .env("RUNWARDEN_SERVER", &serve.url)
        .env("RUNWARDEN_TOKEN", token);
    let (sandbox, through) = (sandbox.clone(), command);
    let through_server = tokio::task::spawn_blocking(move || sandbox.run_command(through))
        .await
        .unwrap();
    (on_store, through_server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_gives_the_same_answers_through_a_server_and_on_the_store() {
    let mcp = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let serve = Serve::start(&sandbox, 0).await; // no workers: queued runs stay queued
    let operator = token(&sandbox, "operator").await;

    // A completed run with events, and a queued one enqueued through the server.
    let ran = runwarden(&sandbox, &["--json", "run", "--agent", "b", "go"])
        .await
        .ok();
    let summary: Value = serde_json::from_str(ran.stdout.lines().last().unwrap()).unwrap();
    let completed = summary["run_id"].as_str().unwrap().to_string();
    let mut enqueue = sandbox.command(&["--json", "enqueue", "--agent", "b", "later"]);
    enqueue
        .env("RUNWARDEN_SERVER", &serve.url)
        .env("RUNWARDEN_TOKEN", &operator);
    let queued = sandbox.run_command(enqueue).ok().json()["run_id"]
        .as_str()
        .unwrap()
        .to_string();

    for args in [
        vec!["--json", "status", completed.as_str()],
        vec!["status", completed.as_str()],
        vec!["--json", "events", completed.as_str()],
        vec!["events", completed.as_str()],
        // O6: through a server, --follow reads the run's Server-Sent Events.
        vec!["--json", "events", completed.as_str(), "--follow"],
        vec!["events", completed.as_str(), "--follow"],
        vec!["--json", "status", queued.as_str()],
    ] {
        let (store, server) = both_ways(&sandbox, &serve, &operator, &args).await;
        let (store, server) = (store.ok(), server.ok());
        assert_eq!(store.stdout, server.stdout, "{args:?}");
    }
    let mut cancel = sandbox.command(&["cancel", &queued]);
    cancel
        .env("RUNWARDEN_SERVER", &serve.url)
        .env("RUNWARDEN_TOKEN", &operator);
    sandbox
        .run_command(cancel)
        .ok()
        .says(&format!("cancelled run {queued} (it was queued)"));
    for args in [
        vec!["cancel", queued.as_str()],
        vec!["status", "01900000-0000-7000-8000-000000000000"],
    ] {
        let (store, server) = both_ways(&sandbox, &serve, &operator, &args).await;
        let (store, server) = (store.fails(), server.fails());
        assert_eq!(store.stderr, server.stderr, "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_records_the_token_that_started_it_and_its_tags_on_every_surface() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let created = runwarden(
        &sandbox,
        &[
            "--json", "token", "create", "--role", "operator", "--name", "ci-bot",
        ],
    )
    .await
    .ok()
    .json();
    let operator = created["token"].as_str().unwrap().to_string();
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);

    let start = json!({"agent": "b", "prompt": "hi", "tags": ["team:payments", "env=prod"]});
    let (status, run) = api
        .call("POST", "/v1/runs", Some(&operator), Some(start.to_string()))
        .await;
    assert_eq!(status, 202, "{run}");
    assert_eq!(run["started_by"], "ci-bot", "by the token's name: {run}");
    assert_eq!(run["tags"], json!(["team:payments", "env=prod"]));
    let id = run["run_id"].as_str().unwrap();
    let shown = runwarden(&sandbox, &["status", id]).await.ok();
    assert!(shown.stdout.contains("started by ci-bot"), "{shown:?}");
    assert!(
        shown.stdout.contains("tags team:payments, env=prod"),
        "{shown:?}"
    );
    assert!(!shown.stdout.contains(&operator), "never the token itself");

    // Free text is not a tag: refused before anything is stored, saying what a tag is.
    let bad = json!({"agent": "b", "prompt": "hi", "tags": ["two words"]});
    let (status, body) = api
        .call("POST", "/v1/runs", Some(&operator), Some(bad.to_string()))
        .await;
    assert_eq!((status, code(&body)), (400, "invalid_request"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("letters, digits"),
        "{body}"
    );
    // A field of the wrong type is said in our words, not the framework's.
    let wrong = json!({"agent": "b", "prompt": "hi", "tags": "x"});
    let (status, body) = api
        .call("POST", "/v1/runs", Some(&operator), Some(wrong.to_string()))
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the body does not fit the request: tags"),
        "{body}"
    );
    assert!(!message.contains("Failed to deserialize"), "{body}");
    // Two live tokens never share a name: policies and limits name a token by it.
    let again = runwarden(
        &sandbox,
        &["token", "create", "--role", "viewer", "--name", "ci-bot"],
    )
    .await;
    assert_ne!(again.code, Some(0), "{again:?}");
    assert!(
        again.stderr.contains("a token named \"ci-bot\" exists"),
        "{again:?}"
    );

    // The command line: tags, and no token started it.
    let queued = runwarden(
        &sandbox,
        &[
            "--json", "enqueue", "--agent", "b", "--tag", "nightly", "hi",
        ],
    )
    .await
    .ok()
    .json();
    let local = runwarden(
        &sandbox,
        &["--json", "status", queued["run_id"].as_str().unwrap()],
    )
    .await
    .ok()
    .json();
    assert_eq!(local["tags"], json!(["nightly"]), "{local}");
    assert_eq!(local["started_by"], Value::Null, "{local}");
    let refused = runwarden(&sandbox, &["enqueue", "--agent", "b", "--tag", "a b", "hi"]).await;
    assert_ne!(refused.code, Some(0), "{refused:?}");
    assert!(refused.stderr.contains("is not a tag"), "{refused:?}");
    let listed = api.get("/v1/runs", &operator).await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 2, "{listed}");
    api.assert_no_sigil();
}
