//! R12 as operators meet it: the real binary in separate processes over one SQLite file,
//! and the real Python MCP peer (`tests/peer/server.py`), whose own counter says how often
//! `create_ticket` (a non-idempotent write) ran. A required approval parks the run before
//! anything is sent; `approve`, `deny`, an edit, two racing approvals, an approval after a
//! cancel, expiry, and an approval through `serve`'s API executed by a worker killed with
//! `kill -9` right after its claim.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::Live as Child;
use crate::support::workers::{WAIT, config_with_short_leases, enqueue, events, kinds, status};
use crate::support::{Sandbox, runwarden};

/// How often the peer ran `create_ticket`, by its own count.
fn tickets(peer: &Peer) -> u64 {
    let stats: Value = serde_json::from_str(&peer.stats()).expect("the peer's stats are JSON");
    stats["create_ticket_calls"].as_u64().unwrap_or(0)
}

/// An initialised sandbox with short leases and the peer imported as `peer`, whose
/// `create_ticket` and `echo` need an approval (`extra` goes into the tool sections), and
/// agent `helper` playing `plan`.
async fn install(peer: &Peer, plan: Value, extra: &str) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = config_with_short_leases(&sandbox);
    text.push_str(&format!(
        "\n[mcp.servers.peer]\nurl = \"{}\"\n\n[mcp.servers.peer.tools.create_ticket]\napproval = \"required\"\n{extra}\n[mcp.servers.peer.tools.echo]\napproval = \"required\"\n\n[agents.helper]\nprovider = \"scripted\"\nscript = \"helper.json\"\ntools = [\"peer__create_ticket\", \"peer__echo\"]\n",
        peer.url()
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("helper.json"), plan.to_string()).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    sandbox
}

fn ticket_plan() -> Value {
    json!([
        {"tool_calls": [{"name": "peer__create_ticket", "arguments": {"title": "printer on fire"}}]},
        {"text": "done"}
    ])
}

/// The pending decision of a run, from `decisions list --json --run`.
async fn pending(sandbox: &Arc<Sandbox>, run_id: &str) -> Value {
    let listed = runwarden(
        sandbox,
        &[
            "--json",
            "decisions",
            "list",
            "--run",
            run_id,
            "--status",
            "pending",
        ],
    )
    .await
    .ok()
    .json();
    let decisions = listed["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 1, "{listed:#}");
    decisions[0].clone()
}

/// Enqueues a run, lets `worker` take it until it parks, and returns its id and decision.
async fn parked(sandbox: &Arc<Sandbox>, worker: &mut Child) -> (String, Value) {
    let run_id = enqueue(sandbox, "helper", "file a ticket").await;
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "waiting_for_approval", "{outcome:#}");
    let decision = pending(sandbox, &run_id).await;
    (run_id, decision)
}

fn tool_texts(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["kind"] == "tool_executed")
        .map(|e| {
            e["payload"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_approval_parks_the_run_sends_nothing_and_approve_runs_the_call_once() {
    let peer = Peer::start(&[]);
    let sandbox = install(&peer, ticket_plan(), "").await;
    let mut worker = Child::worker(&sandbox, None);
    let (run_id, decision) = parked(&sandbox, &mut worker).await;
    assert_eq!(tickets(&peer), 0, "R12: the server receives nothing");
    assert_eq!(decision["kind"], "approval");
    assert_eq!(decision["arguments"], json!({"title": "printer on fire"}));
    let row = status(&sandbox, &run_id).await;
    assert_eq!(row["status"], "waiting_for_approval");
    assert_eq!(row["lease_expires"], Value::Null, "no lease while it waits");
    assert_eq!(row["decision"]["decision_id"], decision["decision_id"]);
    let text = runwarden(&sandbox, &["status", &run_id]).await.ok().stdout;
    assert!(
        text.contains("waiting for decision"),
        "status shows it: {text}"
    );

    let id = decision["decision_id"].as_str().unwrap();
    runwarden(&sandbox, &["approve", id])
        .await
        .ok()
        .says("answered approve");
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(tickets(&peer), 1, "approve runs the call exactly once");
    let log = events(&sandbox, &run_id).await;
    assert!(kinds(&log).contains(&"decision_answered"), "{log:#?}");
    // V7: the answer is in the audit chain with its actor, and the chain verifies.
    let audit = runwarden(&sandbox, &["--json", "audit", "list"])
        .await
        .ok()
        .stdout;
    let answered: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| match v {
            Value::Array(rows) => rows,
            Value::Object(ref o) if o.contains_key("rows") => {
                v["rows"].as_array().cloned().unwrap_or_default()
            }
            other => vec![other],
        })
        .filter(|r| r["action"] == "decision_answered")
        .collect();
    assert_eq!(answered.len(), 1, "{audit}");
    assert_eq!(answered[0]["actor"], "cli");
    runwarden(&sandbox, &["audit", "verify"]).await.ok();
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_gives_the_model_the_denial_and_an_edit_reaches_the_server() {
    let peer = Peer::start(&[]);
    let plan = json!([
        {"tool_calls": [{"name": "peer__create_ticket", "arguments": {"title": "printer"}}]},
        {"tool_calls": [{"name": "peer__echo", "arguments": {"text": "as the model wrote it"}}]},
        {"text": "done"}
    ]);
    let sandbox = install(&peer, plan, "").await;
    let mut worker = Child::worker(&sandbox, None);
    let (run_id, first) = parked(&sandbox, &mut worker).await;
    let id = first["decision_id"].as_str().unwrap();
    runwarden(
        &sandbox,
        &["deny", id, "--reason", "tickets are frozen today"],
    )
    .await
    .ok();
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(
        outcome["outcome"], "waiting_for_approval",
        "the echo waits too"
    );
    let second = pending(&sandbox, &run_id).await;
    let id = second["decision_id"].as_str().unwrap();
    runwarden(&sandbox, &["approve", id, "--arguments", "{\"text\": 5}"])
        .await
        .fails()
        .says("do not fit the schema");
    runwarden(
        &sandbox,
        &[
            "approve",
            id,
            "--arguments",
            "{\"text\": \"as the operator wrote it\"}",
        ],
    )
    .await
    .ok();
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(tickets(&peer), 0, "a denied write is never made");
    let texts = tool_texts(&events(&sandbox, &run_id).await);
    assert_eq!(texts[0], "denied by an operator: tickets are frozen today");
    assert!(
        texts[1].contains("as the operator wrote it") && !texts[1].contains("as the model"),
        "the server got the operator's arguments: {texts:?}"
    );
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_approvals_racing_from_two_processes_run_the_call_once() {
    let peer = Peer::start(&[]);
    let sandbox = install(&peer, ticket_plan(), "").await;
    let mut worker = Child::worker(&sandbox, None);
    let (run_id, decision) = parked(&sandbox, &mut worker).await;
    let id = decision["decision_id"].as_str().unwrap().to_string();
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let (sandbox, id) = (sandbox.clone(), id.clone());
            tokio::task::spawn_blocking(move || sandbox.run(&["approve", &id]))
        })
        .collect();
    let mut won = 0;
    for racer in racers {
        let out = racer.await.unwrap();
        if out.code == Some(0) {
            won += 1;
        } else {
            assert!(out.all().contains("already answered"), "{out:#?}");
        }
    }
    assert_eq!(won, 1, "R12: exactly one answer wins");
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed");
    assert_eq!(tickets(&peer), 1, "the call ran once");
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_after_a_cancel_is_refused_and_nothing_is_sent() {
    let peer = Peer::start(&[]);
    let sandbox = install(&peer, ticket_plan(), "").await;
    let mut worker = Child::worker(&sandbox, None);
    let (run_id, decision) = parked(&sandbox, &mut worker).await;
    runwarden(&sandbox, &["cancel", &run_id]).await.ok();
    let id = decision["decision_id"].as_str().unwrap();
    runwarden(&sandbox, &["approve", id])
        .await
        .fails()
        .says("was cancelled");
    let listed = runwarden(&sandbox, &["--json", "decisions", "list", "--run", &run_id])
        .await
        .ok()
        .json();
    assert_eq!(
        listed["decisions"][0]["status"], "dropped",
        "the cancel won"
    );
    assert_eq!(status(&sandbox, &run_id).await["status"], "cancelled");
    worker.stop_idle().await;
    assert_eq!(tickets(&peer), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_nobody_answers_expires_and_the_model_reads_expired() {
    let peer = Peer::start(&[]);
    let sandbox = install(&peer, ticket_plan(), "approval_timeout_seconds = 0.5\n").await;
    let mut worker = Child::worker(&sandbox, None);
    let (run_id, decision) = parked(&sandbox, &mut worker).await;
    // The worker's reaper denies it once due; the run is queued and completed.
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(tickets(&peer), 0);
    let texts = tool_texts(&events(&sandbox, &run_id).await);
    assert_eq!(texts, ["denied by an operator: expired"]);
    let id = decision["decision_id"].as_str().unwrap();
    runwarden(&sandbox, &["approve", id])
        .await
        .fails()
        .says("expired");
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_through_the_api_is_executed_by_a_worker_and_a_kill_9_after_its_claim_runs_the_call_at_most_once()
 {
    let peer = Peer::start(&[]);
    let sandbox = install(&peer, ticket_plan(), "").await;
    // `serve` answers the API only; the work is done by worker processes.
    let serve = crate::support::serve::Serve::start(&sandbox, 0).await;
    let token = crate::support::serve::token(&sandbox, "operator").await;
    let run_id = enqueue(&sandbox, "helper", "file a ticket").await;
    let mut first = Child::worker(&sandbox, None);
    let (outcome, _) = first.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "waiting_for_approval");
    let decision = pending(&sandbox, &run_id).await;
    let id = decision["decision_id"].as_str().unwrap();

    let http = reqwest::Client::new();
    let answered = http
        .post(format!("{}/v1/decisions/{id}", serve.url()))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(json!({"answer": "approve"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let body: Value = serde_json::from_str(&answered.text().await.unwrap()).unwrap();
    assert_eq!(body["answer"], "approve");
    assert_eq!(body["audited"], true);
    assert_ne!(body["actor"], "cli", "the actor is the token's name");

    // Kill the worker as soon as it has claimed the approved run (its resume step).
    let mut follow = Child::start(&sandbox, &["--json", "events", "--follow", &run_id]);
    let since = Instant::now();
    loop {
        let line = follow.json().await;
        if line["kind"] == "run_resumed" {
            break;
        }
        assert!(since.elapsed() < WAIT, "the worker claimed the run in time");
    }
    first.signal("KILL");
    let _ = first.ended(Instant::now(), WAIT).await;
    // Another worker: the reaper recovers the dead worker's run after its 1 s lease.
    let mut second = Child::worker(&sandbox, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    let end = loop {
        let row = status(&sandbox, &run_id).await;
        let state = row["status"].as_str().unwrap_or_default().to_string();
        if ["completed", "failed"].contains(&state.as_str()) {
            break row;
        }
        assert!(Instant::now() < deadline, "the run ended in time: {row:#}");
        // Wait on the run's next event (or the follower's end) rather than a guessed sleep.
        let _ = tokio::time::timeout(Duration::from_secs(1), follow.stdout.recv()).await;
    };
    let made = tickets(&peer);
    assert!(made <= 1, "R11: at most once, made {made}");
    if end["status"] == "completed" {
        assert_eq!(made, 1, "a completed run made its write");
    } else {
        let reason = end["termination_reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("FENCED_WRITE"), "{end:#}");
    }
    second.stop_idle().await;
    drop(serve);
}

/// An MCP server that starts every write and closes the stream without an answer (R11).
async fn closing_server() -> (
    runwarden_testkit::TestServer,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let writes = Arc::new(AtomicUsize::new(0));
    let seen = writes.clone();
    let normal = runwarden_testkit::mcp_handler(vec![runwarden_testkit::tool("create")], &[]);
    let server =
        runwarden_testkit::TestServer::start(move |request: &runwarden_testkit::HttpRequest| {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            if body["method"] == "tools/call" {
                seen.fetch_add(1, Ordering::SeqCst);
                return runwarden_testkit::HttpReply::typed(200, "text/event-stream", "");
            }
            normal(request)
        })
        .await;
    (server, writes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_write_parks_the_run_and_each_resolve_does_what_it_says() {
    use std::sync::atomic::Ordering;
    let (server, writes) = closing_server().await;
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[agents.helper]\nprovider = \"scripted\"\nscript = \"helper.json\"\ntools = [\"srv__create\"]\n",
        server.url("/mcp")
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let plan = json!([
        {"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]},
        {"text": "done"}
    ]);
    std::fs::write(sandbox.path().join("helper.json"), plan.to_string()).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    let mut worker = Child::worker(&sandbox, None);
    for (flag, end) in [
        ("--applied", "completed"),
        ("--not-applied", "completed"),
        ("--cancel", "cancelled"),
    ] {
        let before = writes.load(Ordering::SeqCst);
        let (run_id, decision) = parked(&sandbox, &mut worker).await;
        assert_eq!(decision["kind"], "effect_uncertain", "{decision:#}");
        assert_eq!(writes.load(Ordering::SeqCst), before + 1);
        let row = status(&sandbox, &run_id).await;
        assert_eq!(row["pending_effect"], "non_idempotent_write", "R11: fenced");
        let id = decision["decision_id"].as_str().unwrap();
        runwarden(&sandbox, &["approve", id])
            .await
            .fails()
            .says("takes applied, not_applied, cancel");
        runwarden(&sandbox, &["resolve", id, flag]).await.ok();
        if end == "cancelled" {
            assert_eq!(status(&sandbox, &run_id).await["status"], "cancelled");
        } else {
            let (outcome, _) = worker.outcome_of(&run_id).await;
            assert_eq!(outcome["outcome"], end, "{flag}: {outcome:#}");
            let row = status(&sandbox, &run_id).await;
            assert_eq!(
                row["pending_effect"],
                Value::Null,
                "{flag}: the fence is cleared"
            );
            let log = events(&sandbox, &run_id).await;
            let told = tool_texts(&log);
            assert!(
                told.is_empty(),
                "the uncertain step is not a tool_executed one"
            );
            assert!(
                kinds(&log).ends_with(&["model_response", "run_completed"]),
                "{flag}"
            );
        }
        assert_eq!(
            writes.load(Ordering::SeqCst),
            before + 1,
            "{flag}: nothing re-sends the write"
        );
    }
    worker.stop_idle().await;
}

/// M14 + R12 end to end: a server's question (`elicitation/create` from the real Python
/// peer, in the call's response stream) becomes an `input` decision when the server's
/// policy is `operator`; an operator answers it from another process with `runwarden
/// answer`, and the answer reaches the server, which puts it in the tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_question_is_answered_by_an_operator_and_the_answer_reaches_the_server() {
    let peer = Peer::start(&[]);
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        "[mcp.servers.peer]\nurl = \"{}\"\nelicitation = \"operator\"\ntimeout_seconds = 60\n# A question inside a call's stream is the 2025-11-25 way (M14).\nprotocol = \"2025-11-25\"\n\n[agents.asker]\nprovider = \"scripted\"\nscript = \"asker.json\"\ntools = [\"peer__ask_name\"]\n",
        peer.url()
    ));
    std::fs::write(
        sandbox.path().join("asker.json"),
        json!([
            {"tool_calls": [{"name": "peer__ask_name", "arguments": {}}]},
            {"text": "done"}
        ])
        .to_string(),
    )
    .unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();

    let started = Instant::now();
    let mut run = Child::start(&sandbox, &["run", "--agent", "asker", "name the ticket"]);
    let first = run.err_line().await;
    let run_id = first
        .strip_prefix("run ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the run names itself first: {first}"))
        .to_string();
    // The question shows in the run's log: wait for it there, not on a clock.
    let mut follow = Child::start(&sandbox, &["events", &run_id, "--follow"]);
    loop {
        let line = follow.line().await;
        if line.contains("waiting for an operator: input decision") {
            break;
        }
    }
    let decision = pending(&sandbox, &run_id).await;
    assert_eq!(decision["kind"], "input", "{decision:#}");
    let id = decision["decision_id"].as_str().unwrap();
    runwarden(&sandbox, &["answer", id, "--content", r#"{"name": "Ada"}"#])
        .await
        .ok();

    let ended = run.ended(started, WAIT).await;
    assert_eq!(ended.code, Some(0), "{ended:#?}");
    let texts = tool_texts(&events(&sandbox, &run_id).await);
    assert_eq!(
        texts,
        ["accepted: Ada"],
        "the server got the operator's answer"
    );
    // The follower ends by itself after the run's final event.
    let followed = follow.ended(started, WAIT).await;
    assert_eq!(followed.code, Some(0), "{followed:#?}");
}
