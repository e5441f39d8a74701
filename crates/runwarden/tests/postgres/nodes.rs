//! Many nodes on one PostgreSQL database (O3 amended): one `runwarden serve` (node A) and
//! two `runwarden worker` processes, separate processes sharing a fresh database of the
//! test cluster, against the counting MCP server of `worker.rs`. Each queued run is
//! claimed exactly once across all of them (R3); a cancel through node A's API tears down
//! a call in flight on a worker node (R4, R6); `kill -9` of a worker node is recovered by
//! another (R9); no write reaches the server twice.
//!
//! Waits are on the MCP server's events, the children's output lines and the API's event
//! streams, each with a timeout; never on a guessed sleep.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use runwarden_testkit::TempCluster;
use serde_json::{Value, json};

use crate::support::Live as Child;
use crate::support::serve::{Api, Serve, SseReader, token};
use crate::support::workers::{
    Install, WAIT, WORKER_SETTINGS, call_then_answer, enqueue, events, install_in, kinds, status,
    until_call_is_held, write_agents,
};
use crate::support::{Sandbox, runwarden};

/// Queued runs in the claim test.
const RUNS: usize = 60;
/// Leases that do not lapse while 60 runs share six slots on a loaded machine: the claim
/// test is about claims, not about recovery.
const LONG_LEASES: &str = "lease_seconds = 30.0\nheartbeat_seconds = 10.0\n";
/// Generous: a call on another node learns of a cancel from the store's NOTIFY (the
/// per-process status watcher) in milliseconds, or else from its own read of the row,
/// made at most once a second (R6). Only a cancel that never arrives fails this.
const CROSS_NODE: Duration = Duration::from_secs(5);
/// The watchers' periodic refresh far beyond `CROSS_NODE`: a call on another node can only
/// learn of a cancel in time through PostgreSQL's NOTIFY (R6 amended, O6).
const NOTIFY_ONLY: &str = "status_refresh_seconds = 60.0\n";

/// A fresh database on the test cluster and an installation on it (see `install_in`).
/// The cluster is returned so it outlives the nodes; drop it last.
async fn on_postgres(worker_settings: &str, agents: &[(String, Value)]) -> (TempCluster, Install) {
    let cluster = TempCluster::start();
    let url = cluster.fresh_database().await;
    let sandbox = tokio::task::spawn_blocking(move || Sandbox::initialised_on(&url))
        .await
        .unwrap();
    let install = install_in(sandbox, worker_settings, agents).await;
    (cluster, install)
}

/// Which of `workers` holds the run `status` describes (its lease holder names the
/// process: `worker-<pid>-<uuid>`); fails if none does.
#[track_caller]
fn holder(workers: &[Child], status: &Value) -> usize {
    let owner = status["lease_holder"].as_str().unwrap_or_default();
    workers
        .iter()
        .position(|w| owner.starts_with(&format!("worker-{}-", w.pid)))
        .unwrap_or_else(|| panic!("no worker process holds the run: {status:#}"))
}

/// `POST /v1/runs` in queued mode; the run id.
async fn enqueue_through_api(api: &Api, operator: &str, agent: &str, prompt: &str) -> String {
    let body = json!({"agent": agent, "prompt": prompt, "mode": "queued"}).to_string();
    let (code, run) = api
        .call("POST", "/v1/runs", Some(operator), Some(body))
        .await;
    assert_eq!(code, 202, "{run}");
    assert_eq!(run["status"], "queued", "{run}");
    run["run_id"].as_str().unwrap().to_string()
}

/// The kinds of a run's events, read from node A's live event stream until it ends (it
/// ends once the run is terminal and its final event is stored).
async fn kinds_until_the_end(api: Api, id: String, token: String) -> (String, Vec<String>) {
    let mut stream = SseReader::open(&api, &id, &token, None).await;
    let mut kinds = Vec::new();
    while let Some(event) = stream.next().await {
        kinds.push(event.kind);
    }
    (id, kinds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queued_run_is_claimed_exactly_once_across_a_server_and_two_worker_processes() {
    // Agent nK writes `create({"q": "answer K"})` once, so the server counts per run.
    let agents = write_agents("n", "answer", RUNS);
    let (
        _cluster,
        Install {
            sandbox,
            calls,
            server: _server,
        },
    ) = on_postgres(LONG_LEASES, &agents).await;
    let operator = token(&sandbox, "operator").await;
    // Three claimants: node A's own two slots and two worker nodes of two slots each.
    let serve = Serve::start(&sandbox, 2).await;
    let mut workers: Vec<Child> = (0..2).map(|_| Child::worker(&sandbox, Some(2))).collect();
    let api = Api::new(&serve);

    // Half through node A's API, half through the CLI, at once, while everyone claims.
    let through_api = async {
        let mut ids = Vec::new();
        for k in (0..RUNS).step_by(2) {
            ids.push((
                k,
                enqueue_through_api(&api, &operator, &format!("n{k}"), "write").await,
            ));
        }
        ids
    };
    let through_cli = async {
        let mut ids = Vec::new();
        for k in (1..RUNS).step_by(2) {
            ids.push((k, enqueue(&sandbox, &format!("n{k}"), "write").await));
        }
        ids
    };
    let (by_api, by_cli) = tokio::join!(through_api, through_cli);
    let runs: BTreeMap<String, usize> = by_api
        .into_iter()
        .chain(by_cli)
        .map(|(k, id)| (id, k))
        .collect();
    assert_eq!(runs.len(), RUNS, "every enqueue made its own run");

    // Every run's event stream, from node A, read to its end.
    let streams: Vec<_> = runs
        .keys()
        .map(|id| {
            tokio::spawn(kinds_until_the_end(
                api.clone(),
                id.clone(),
                operator.clone(),
            ))
        })
        .collect();
    for stream in streams {
        let (id, kinds) = tokio::time::timeout(WAIT * 6, stream)
            .await
            .unwrap_or_else(|_| panic!("every run ended in time"))
            .unwrap();
        let count = |kind: &str| kinds.iter().filter(|k| *k == kind).count();
        assert_eq!(
            count("run_started"),
            1,
            "R3: run {id} claimed once: {kinds:?}"
        );
        assert_eq!(count("tool_executed"), 1, "run {id}: {kinds:?}");
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("run_completed"),
            "run {id}: {kinds:?}"
        );
    }

    // Who ran what, from the rows (node A's API) and from the worker nodes' own lines.
    let serve_owner = format!("serve-{}-", serve.pid());
    let mut by_node: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for id in runs.keys() {
        let run = api.get(&format!("/v1/runs/{id}"), &operator).await;
        assert_eq!(run["status"], "completed", "{run:#}");
        assert_eq!(run["attempts"], 1, "never requeued: {run:#}");
        assert_eq!(
            run["pending_effect"],
            Value::Null,
            "R7: the fence is cleared: {run:#}"
        );
        let owner = run["lease_holder"].as_str().unwrap_or_default();
        let node = if owner.starts_with(&serve_owner) {
            "serve".to_string()
        } else {
            format!("worker {}", holder(&workers, &run))
        };
        by_node.entry(node).or_default().insert(id.clone());
    }
    for (w, worker) in workers.iter_mut().enumerate() {
        worker.signal("TERM");
        let ended = worker.ended(Instant::now(), Duration::from_secs(2)).await;
        assert_eq!(ended.code, Some(0), "{ended:#?}");
        let mut printed = BTreeSet::new();
        for line in &ended.stdout {
            let line: Value = serde_json::from_str(line).unwrap();
            if line["stopped"] == true {
                continue;
            }
            assert_eq!(line["outcome"], "completed", "{line}");
            let id = line["run_id"].as_str().unwrap().to_string();
            assert!(printed.insert(id), "worker {w} ran a run twice: {ended:#?}");
        }
        let named = by_node
            .get(&format!("worker {w}"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            printed, named,
            "worker {w} printed exactly the runs whose rows name it"
        );
    }
    let spread: BTreeMap<&String, usize> = by_node.iter().map(|(n, ids)| (n, ids.len())).collect();
    println!(
        "{RUNS} queued runs (half API, half CLI) over serve x 2 + 2 workers x 2 on PostgreSQL: {spread:?}"
    );
    assert!(
        by_node.len() >= 2,
        "the runs were shared between nodes: {spread:?}"
    );

    // The server's count: one write per run, none twice.
    for (id, k) in &runs {
        assert_eq!(
            calls.of("create", &format!("answer {k}")),
            1,
            "run {id} wrote once"
        );
    }
    assert_eq!(calls.total("create"), RUNS, "0 duplicate writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_the_api_of_one_node_tears_down_a_call_in_flight_on_another_node() {
    let plan = call_then_answer("create", "held");
    let (
        _cluster,
        Install {
            sandbox,
            mut server,
            calls,
        },
    ) = on_postgres(
        &format!("{WORKER_SETTINGS}{NOTIFY_ONLY}"),
        &[("writer".to_string(), plan)],
    )
    .await;
    let operator = token(&sandbox, "operator").await;
    // Node A serves the API with no worker slot: it claims nothing, so the run is on B.
    let serve = Serve::start(&sandbox, 0).await;
    let mut node_b = Child::worker(&sandbox, Some(1));
    let api = Api::new(&serve);
    let id = enqueue_through_api(&api, &operator, "writer", "open a ticket").await;
    until_call_is_held(&mut server, "create", "held").await;
    let held = api.get(&format!("/v1/runs/{id}"), &operator).await;
    assert_eq!(holder(std::slice::from_ref(&node_b), &held), 0);
    assert_eq!(held["status"], "running", "{held:#}");
    assert_eq!(held["pending_effect"], "non_idempotent_write", "{held:#}");

    let sent = Instant::now();
    let (code, cancelled) = api
        .call(
            "POST",
            &format!("/v1/runs/{id}/cancel"),
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(code, 200, "{cancelled}");
    assert_eq!(
        cancelled,
        json!({"run_id": id, "cancelled": true, "previous": "running"}),
        "R4: node A's guarded update won the row"
    );
    // R6: node B's call learns of it and its connection closes.
    let closed = server.next_close(CROSS_NODE).await;
    let took = closed.saturating_duration_since(sent);
    println!("cancel through node A's API to the close of node B's call: {took:?}");
    assert!(took < CROSS_NODE, "{took:?}");
    // M4 (amended): B tells the server the call it stopped waiting for is cancelled.
    loop {
        let request = server.next_request(WAIT).await;
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        assert_ne!(body["method"], "tools/call", "nothing is re-sent: {body}");
        if body["method"] == "notifications/cancelled" {
            break;
        }
    }

    let (outcome, before) = node_b.outcome_of(&id).await;
    assert_eq!(outcome["outcome"], "cancelled", "R10: {outcome}");
    assert!(before.is_empty(), "{before:#?}");
    let ended = node_b.stop_idle().await;
    assert!(
        ended.stderr.iter().all(|l| !l.contains("panicked")),
        "{ended:#?}"
    );
    let run = api.get(&format!("/v1/runs/{id}"), &operator).await;
    assert_eq!(run["status"], "cancelled", "{run:#}");
    assert_eq!(
        run["pending_effect"], "non_idempotent_write",
        "R7, R11: a write cancelled in flight keeps its fence: {run:#}"
    );
    assert_eq!(calls.of("create", "held"), 1, "the write went out once");
}

/// Node A (the API alone) and two worker nodes of one slot each; the run of `agent`
/// enqueued through the CLI with its call (`tool`, `q`) held by the server. Answers the
/// run id, the worker nodes and which of them holds the run.
async fn a_call_held_on_one_of_two_workers(
    install: &mut Install,
    agent: &str,
    tool: &str,
    q: &str,
) -> (String, Vec<Child>, usize, Value) {
    let workers: Vec<Child> = (0..2)
        .map(|_| Child::worker(&install.sandbox, Some(1)))
        .collect();
    let id = enqueue(&install.sandbox, agent, q).await;
    until_call_is_held(&mut install.server, tool, q).await;
    let held = status(&install.sandbox, &id).await;
    assert_eq!(held["status"], "running", "{held:#}");
    let victim = holder(&workers, &held);
    (id, workers, victim, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_worker_node_during_a_read_only_call_is_recovered_and_completed_by_another_node()
 {
    let plan = call_then_answer("search", "printer");
    let (_cluster, mut install) =
        on_postgres(WORKER_SETTINGS, &[("reader".to_string(), plan)]).await;
    let _node_a = Serve::start(&install.sandbox, 0).await;
    let (id, mut workers, victim, held) =
        a_call_held_on_one_of_two_workers(&mut install, "reader", "search", "printer").await;
    assert_eq!(
        held["pending_effect"],
        Value::Null,
        "read-only: no fence: {held:#}"
    );

    let mut killed = workers.remove(victim);
    let mut survivor = workers.pop().unwrap();
    let at = Instant::now();
    killed.signal("KILL");
    assert_eq!(
        killed.ended(at, WAIT).await.code,
        None,
        "killed by the signal"
    );
    // R9: the surviving node's reaper requeues the stale run; the same node claims it.
    survivor
        .until_stderr(&["the reaper recovered a stale run", &id, "Requeued"])
        .await;
    let (outcome, before) = survivor.outcome_of(&id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert!(before.is_empty(), "{before:#?}");
    println!(
        "kill -9 of the node holding a read-only call to its completion elsewhere: {:?}",
        at.elapsed()
    );
    survivor.stop_idle().await;

    let done = status(&install.sandbox, &id).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        done["attempts"], 2,
        "the dead node's attempt and this one: {done:#}"
    );
    assert_ne!(done["lease_holder"], held["lease_holder"], "{done:#}");
    assert_eq!(
        install.calls.of("search", "printer"),
        2,
        "a read-only call may run again"
    );
    let events = events(&install.sandbox, &id).await;
    let kinds = kinds(&events);
    assert_eq!(kinds.last(), Some(&"run_completed"), "{events:#?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "tool_executed").count(),
        1,
        "the killed attempt recorded no tool step: {events:#?}"
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "R1: strictly increasing: {seqs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_worker_node_during_a_non_idempotent_write_dead_letters_the_run_and_the_write_happens_once()
 {
    let plan = call_then_answer("create", "fenced");
    let (_cluster, mut install) =
        on_postgres(WORKER_SETTINGS, &[("writer".to_string(), plan)]).await;
    let _node_a = Serve::start(&install.sandbox, 0).await;
    let (id, mut workers, victim, held) =
        a_call_held_on_one_of_two_workers(&mut install, "writer", "create", "fenced").await;
    assert_eq!(
        held["pending_effect"], "non_idempotent_write",
        "R7: the fence is stamped before the write goes out: {held:#}"
    );

    let mut killed = workers.remove(victim);
    let mut survivor = workers.pop().unwrap();
    let at = Instant::now();
    killed.signal("KILL");
    assert_eq!(
        killed.ended(at, WAIT).await.code,
        None,
        "killed by the signal"
    );
    // R9: a fenced non-idempotent write is dead-lettered, whatever the budget.
    survivor
        .until_stderr(&["the reaper recovered a stale run", &id, "FencedWrite"])
        .await;
    // The survivor completes a later run, so it has looked at the queue since the dead
    // letter; the dead-lettered run is not among what it ran.
    let sentinel = enqueue(&install.sandbox, "quick", "sentinel").await;
    let (outcome, before) = survivor.outcome_of(&sentinel).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert!(
        before.is_empty(),
        "the survivor ran only the sentinel: {before:#?}"
    );
    let ended = survivor.stop_idle().await;
    assert!(
        ended.stdout.iter().all(|l| !l.contains(&id)),
        "the dead-lettered run never ran again: {ended:#?}"
    );

    let dead = status(&install.sandbox, &id).await;
    assert_eq!(dead["status"], "failed", "{dead:#}");
    let reason = dead["termination_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("FENCED_WRITE") && reason.contains("non_idempotent_write"),
        "R9: the reason names the fenced write: {dead:#}"
    );
    assert_eq!(
        dead["pending_effect"], "non_idempotent_write",
        "R7: kept: {dead:#}"
    );
    assert_eq!(dead["attempts"], 1, "never requeued: {dead:#}");
    assert_eq!(install.calls.of("create", "fenced"), 1, "at most once (R9)");
    assert_eq!(install.calls.total("create"), 1, "0 duplicate writes");
    // Every node appended to one audit chain, and it verifies.
    runwarden(&install.sandbox, &["audit", "verify"])
        .await
        .ok()
        .says("intact");
}
