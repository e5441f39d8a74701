//! `runwarden enqueue`, `worker`, `reap`, `cancel` and `status` as separate processes
//! sharing one SQLite file, against a real MCP server on 127.0.0.1 that counts the
//! `tools/call` requests it receives (R3, R9, R10): a worker killed with `kill -9` mid-call,
//! workers racing for the same rows, and the two-step SIGTERM.
//!
//! Leases are short (1 s, a heartbeat every 0.3 s, the reaper every 0.2 s) so a trial takes
//! about a lease. Waits are on the server's events, the children's output lines, or the
//! wall-clock lease expiry that `status --json` reports; never on a guessed sleep.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpRequest, Reply, Seen, TestServer, mcp_handler, tool};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::Live as Child;
use crate::support::{Ended, Sandbox, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// Short leases so a dead worker's run is recoverable within about a second.
pub(crate) const WORKER_SETTINGS: &str = "lease_seconds = 1.0\nheartbeat_seconds = 0.3\nreap_seconds = 0.2\nretry_base_seconds = 0.05\ngrace_seconds = 20\n";
/// The sandbox's configuration with the template's lease and heartbeat lines replaced by
/// [`WORKER_SETTINGS`], ready for more sections to be appended.
pub(crate) fn config_with_short_leases(sandbox: &Sandbox) -> String {
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    for template_line in ["lease_seconds = 30 ", "heartbeat_seconds = 10 "] {
        let line = text
            .lines()
            .find(|l| l.starts_with(template_line))
            .unwrap_or_else(|| panic!("the template changed:\n{text}"))
            .to_string();
        text = text.replace(&format!("{line}\n"), "");
    }
    text.replace("\n[worker]\n", &format!("\n[worker]\n{WORKER_SETTINGS}"))
}

/// Makes each worker log what its reaper did, so a test can wait for that line.
const REAPER_LOG: &str = "runwarden_runtime::worker=info";
/// How many kill -9 trials the write test repeats.
const TRIALS: usize = 20;

/// The `tools/call` requests the server received, by `"<tool> <q argument>"`, and, for a
/// `create` whose argument starts with `answer`, the database lock the server took before
/// answering it (so the worker cannot record the answer).
#[derive(Clone, Default)]
pub(crate) struct Calls(
    Arc<Mutex<BTreeMap<String, usize>>>,
    Arc<Mutex<Option<LockHold>>>,
);

/// The database to lock, and the connection holding its write lock once taken.
type LockHold = (PathBuf, Option<rusqlite::Connection>);

impl Calls {
    pub(crate) fn of(&self, tool: &str, q: &str) -> usize {
        let calls = self.0.lock().expect("not poisoned");
        calls.get(&format!("{tool} {q}")).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self, tool: &str) -> usize {
        let calls = self.0.lock().expect("not poisoned");
        let prefix = format!("{tool} ");
        calls
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

/// An MCP server with three tools that counts every `tools/call` before it answers:
/// `create` (a non-idempotent write) never answers, so a call to it is in flight until the
/// client goes away, except `create({"q": "answer..."})`, which answers (after taking the
/// SQLite database's write lock when [`Calls`] names a database to lock); `search` (read-only) stalls on its first call for each argument and
/// answers the later ones; `lookup` (read-only) answers at once.
fn counting_server(calls: Calls) -> impl Fn(&HttpRequest) -> Reply + Send + Sync + 'static {
    let answer = mcp_handler(vec![tool("create"), tool("search"), tool("lookup")], &[]);
    move |request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call" {
            let name = body["params"]["name"].as_str().unwrap_or_default();
            let q = body["params"]["arguments"]["q"]
                .as_str()
                .unwrap_or_default();
            let seen = {
                let mut calls = calls.0.lock().expect("not poisoned");
                let count = calls.entry(format!("{name} {q}")).or_default();
                *count += 1;
                *count
            };
            if name == "create" && q.starts_with("answer") {
                let mut hold = calls.1.lock().expect("not poisoned");
                if let Some((database, held)) = hold.as_mut() {
                    let lock = rusqlite::Connection::open(&*database).expect("the database");
                    lock.execute_batch("BEGIN EXCLUSIVE")
                        .expect("the write lock");
                    *held = Some(lock);
                }
            } else if name == "create" || (name == "search" && seen == 1) {
                return Reply::Stall;
            }
        }
        answer(request)
    }
}

/// One installation: a sandbox whose agents use the counting server `srv`.
pub(crate) struct Install {
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) server: TestServer,
    pub(crate) calls: Calls,
}

/// A plan with one tool call `srv__<tool>({"q": q})`, then a final answer.
pub(crate) fn call_then_answer(tool: &str, q: &str) -> Value {
    json!([
        {"tool_calls": [{"name": format!("srv__{tool}"), "arguments": {"q": q}}]},
        {"text": "done"}
    ])
}

/// `n` agents `<name>K`, each calling `create({"q": "<q> K"})` once, so the server counts
/// per run.
pub(crate) fn write_agents(name: &str, q: &str, n: usize) -> Vec<(String, Value)> {
    (0..n)
        .map(|k| {
            (
                format!("{name}{k}"),
                call_then_answer("create", &format!("{q} {k}")),
            )
        })
        .collect()
}

/// A plan that answers at once, with no tool.
fn answer_at_once() -> Value {
    json!([{"text": "done"}])
}

/// An initialised sandbox (SQLite) with short leases, the counting server imported as
/// `srv` (`search` and `lookup` declared read-only), agent `quick` answering at once, and
/// one scripted agent per `(name, plan)`.
async fn install(agents: &[(String, Value)]) -> Install {
    install_in(Sandbox::initialised(), WORKER_SETTINGS, agents).await
}

/// [`install`] in an initialised `sandbox` (whichever store it names), with the
/// `[worker]` settings `worker_settings` in place of the template's lease and heartbeat.
pub(crate) async fn install_in(
    sandbox: Sandbox,
    worker_settings: &str,
    agents: &[(String, Value)],
) -> Install {
    let calls = Calls::default();
    let mut server = TestServer::start(counting_server(calls.clone())).await;
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    for template_line in ["lease_seconds = 30 ", "heartbeat_seconds = 10 "] {
        let line = text
            .lines()
            .find(|l| l.starts_with(template_line))
            .unwrap_or_else(|| panic!("the template changed:\n{text}"))
            .to_string();
        text = text.replace(&format!("{line}\n"), "");
    }
    assert!(
        text.contains("\n[worker]\n"),
        "the template changed:\n{text}"
    );
    text = text.replace("\n[worker]\n", &format!("\n[worker]\n{worker_settings}"));
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[mcp.servers.srv.tools.search]\neffect = \"read_only\"\n\n[mcp.servers.srv.tools.lookup]\neffect = \"read_only\"\n",
        server.url("/mcp")
    ));
    let quick = ("quick".to_string(), answer_at_once());
    for (name, plan) in agents.iter().chain([&quick]) {
        text.push_str(&format!(
            "\n[agents.{name}]\nprovider = \"scripted\"\nscript = \"{name}.json\"\ntools = [\"srv__*\"]\n"
        ));
        std::fs::write(
            sandbox.path().join(format!("{name}.json")),
            plan.to_string(),
        )
        .unwrap();
    }
    std::fs::write(sandbox.config(), text).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    server.drain_requests();
    Install {
        sandbox,
        server,
        calls,
    }
}

/// `enqueue`; the run id it printed.
pub(crate) async fn enqueue(sandbox: &Arc<Sandbox>, agent: &str, prompt: &str) -> String {
    let out = runwarden(sandbox, &["enqueue", "--agent", agent, prompt])
        .await
        .ok();
    let id = out.stdout.trim().to_string();
    assert_eq!(id.len(), 36, "enqueue prints the run id: {out:#?}");
    id
}

/// `status --json`.
pub(crate) async fn status(sandbox: &Arc<Sandbox>, id: &str) -> Value {
    runwarden(sandbox, &["--json", "status", id])
        .await
        .ok()
        .json()
}

/// `events --json`, one object per line.
pub(crate) async fn events(sandbox: &Arc<Sandbox>, id: &str) -> Vec<Value> {
    runwarden(sandbox, &["--json", "events", id])
        .await
        .ok()
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

pub(crate) fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

/// Waits until the wall clock is past the lease expiry `status` reported. The reaper
/// compares `lease_expires < now`, so a few milliseconds past it the run is stale.
pub(crate) async fn past_lease_expiry(status: &Value) {
    let text = status["lease_expires"]
        .as_str()
        .unwrap_or_else(|| panic!("a running run has a lease: {status:#}"));
    let expires = chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("lease_expires is RFC 3339 ({e}): {text}"));
    let left = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    assert!(left < WAIT, "a lease of 1 s expires soon, not in {left:?}");
    tokio::time::sleep(left + Duration::from_millis(20)).await;
}

/// Waits until the server holds the `tools/call` of `tool` with argument `q`.
pub(crate) async fn until_call_is_held(server: &mut TestServer, tool: &str, q: &str) {
    loop {
        let request = server.next_request(WAIT).await;
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call"
            && body["params"]["name"] == tool
            && body["params"]["arguments"]["q"] == q
        {
            return;
        }
    }
}

impl Child {
    /// `runwarden --json worker [--concurrency N]`, its reaper logging what it recovers.
    pub(crate) fn worker(sandbox: &Sandbox, concurrency: Option<usize>) -> Self {
        let concurrency = concurrency.map(|n| n.to_string());
        let mut args = vec!["--json", "worker"];
        if let Some(n) = &concurrency {
            args.extend(["--concurrency", n]);
        }
        let mut command = sandbox.command(&args);
        command.env("RUNWARDEN_LOG", REAPER_LOG);
        Self::spawn(command)
    }

    /// Reads outcome lines until the one for `run_id`; returns it and the lines before it.
    pub(crate) async fn outcome_of(&mut self, run_id: &str) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let line = self.json().await;
            if line["run_id"] == run_id {
                return (line, before);
            }
            before.push(line);
        }
    }

    /// Reads stderr until a line containing every one of `needles`.
    pub(crate) async fn until_stderr(&mut self, needles: &[&str]) -> String {
        loop {
            let line = tokio::time::timeout(WAIT, self.stderr.recv())
                .await
                .unwrap_or_else(|_| panic!("a line on stderr with {needles:?} in time"))
                .expect("stderr ended early");
            if needles.iter().all(|n| line.contains(n)) {
                return line;
            }
        }
    }

    /// SIGTERM on a worker with nothing running: it exits at once, successfully.
    pub(crate) async fn stop_idle(&mut self) -> Ended {
        let since = Instant::now();
        self.signal("TERM");
        let ended = self.ended(since, Duration::from_secs(2)).await;
        assert_eq!(ended.code, Some(0), "{ended:#?}");
        ended
    }
}

/// The worker's closing summary, the last stdout line of `--json worker`.
pub(crate) fn summary(ended: &Ended) -> Value {
    let last = ended.stdout.last().unwrap_or_else(|| panic!("{ended:#?}"));
    let summary: Value = serde_json::from_str(last).unwrap();
    assert_eq!(summary["stopped"], true, "{ended:#?}");
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_non_idempotent_write_dead_letters_the_run_and_the_write_happens_once() {
    // One agent per trial, each sending its own argument, so the server counts per run.
    let agents = write_agents("w", "trial", TRIALS);
    let Install {
        sandbox,
        mut server,
        calls,
    } = install(&agents).await;
    let started = Instant::now();
    let mut runs = Vec::new();

    for (k, (agent, _)) in agents.iter().enumerate() {
        let q = format!("trial {k}");
        let id = enqueue(&sandbox, agent, &q).await;
        let mut first = Child::worker(&sandbox, None);
        until_call_is_held(&mut server, "create", &q).await;
        let held = status(&sandbox, &id).await;
        assert_eq!(held["status"], "running", "{held:#}");
        assert_eq!(
            held["pending_effect"], "non_idempotent_write",
            "R7: the fence is stamped before the write goes out: {held:#}"
        );

        let killed = Instant::now();
        first.signal("KILL");
        let ended = first.ended(killed, WAIT).await;
        assert_eq!(ended.code, None, "killed by the signal: {ended:#?}");
        // The dead worker renews nothing more: the lease it last wrote is the one to wait out.
        past_lease_expiry(&status(&sandbox, &id).await).await;

        // Even trials: the operator's `reap`, before any other worker is up. Odd trials: the
        // second worker's own reaper.
        if k.is_multiple_of(2) {
            runwarden(&sandbox, &["reap"])
                .await
                .ok()
                .says(&format!("run {id} dead-lettered FENCED_WRITE"));
        }
        let mut second = Child::worker(&sandbox, None);
        if !k.is_multiple_of(2) {
            second
                .until_stderr(&["the reaper recovered a stale run", &id, "FencedWrite"])
                .await;
        }
        // The second worker completes a later run, so it has looked at the queue since the
        // dead letter; the dead-lettered run is not among what it ran.
        let sentinel = enqueue(&sandbox, "quick", &format!("sentinel {k}")).await;
        let (outcome, before) = second.outcome_of(&sentinel).await;
        assert_eq!(outcome["outcome"], "completed", "{outcome}");
        assert!(
            before.is_empty(),
            "the second worker ran only the sentinel: {before:#?}"
        );
        let ended = second.stop_idle().await;
        assert!(
            ended.stdout.iter().all(|l| !l.contains(&id)),
            "the dead-lettered run never ran again: {ended:#?}"
        );

        let dead = status(&sandbox, &id).await;
        assert_eq!(dead["status"], "failed", "{dead:#}");
        let reason = dead["termination_reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("FENCED_WRITE") && reason.contains("non_idempotent_write"),
            "R9: the reason names the fenced write: {dead:#}"
        );
        assert_eq!(
            dead["pending_effect"], "non_idempotent_write",
            "R7: the mark of the write in flight is kept: {dead:#}"
        );
        assert_eq!(dead["attempts"], 1, "never requeued: {dead:#}");
        assert_eq!(
            calls.of("create", &q),
            1,
            "trial {k}: one call reached the server"
        );
        runs.push((id, q));
    }

    // Counted again at the end, so a late duplicate of an early trial shows too.
    let duplicates: usize = runs
        .iter()
        .map(|(_, q)| calls.of("create", q).saturating_sub(1))
        .sum();
    let dead_lettered = {
        let mut n = 0;
        for (id, _) in &runs {
            n += usize::from(status(&sandbox, id).await["status"] == "failed");
        }
        n
    };
    println!(
        "{TRIALS} kill -9 trials in {:.1?}: {dead_lettered} dead-lettered FENCED_WRITE, \
         {} tools/call to the write tool, {duplicates} duplicates",
        started.elapsed(),
        calls.total("create"),
    );
    assert_eq!(dead_lettered, TRIALS);
    assert_eq!(calls.total("create"), TRIALS);
    assert_eq!(duplicates, 0, "at most once (R9)");
}

/// How many kill -9 trials the answered-but-unrecorded test repeats.
const ANSWERED_TRIALS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_server_answered_a_write_and_before_it_was_recorded_never_repeats_it() {
    let agents = write_agents("a", "answer", ANSWERED_TRIALS);
    let Install {
        sandbox,
        mut server,
        calls,
    } = install(&agents).await;
    *calls.1.lock().unwrap() = Some((sandbox.database(), None));
    let started = Instant::now();
    for (k, (agent, _)) in agents.iter().enumerate() {
        let q = format!("answer {k}");
        let id = enqueue(&sandbox, agent, &q).await;
        let mut command = sandbox.command(&["--json", "worker"]);
        command.env("RUNWARDEN_LOG", "runwarden_vault=debug");
        let mut first = Child::spawn(command);
        until_call_is_held(&mut server, "create", &q).await;
        // The server took the write lock, then answered: the worker has the answer and
        // can record neither its audit outcome nor its step. That is the window.
        first
            .until_stderr(&["outbound call answered", "tools/call"])
            .await;
        let killed = Instant::now();
        first.signal("KILL");
        assert_eq!(first.ended(killed, WAIT).await.code, None);
        if let Some((_, held)) = calls.1.lock().unwrap().as_mut() {
            *held = None; // rolls back and releases the lock
        }
        past_lease_expiry(&status(&sandbox, &id).await).await;
        runwarden(&sandbox, &["reap"])
            .await
            .ok()
            .says(&format!("run {id} dead-lettered FENCED_WRITE"));
        let dead = status(&sandbox, &id).await;
        assert_eq!(dead["status"], "failed", "{dead:#}");
        assert_eq!(dead["pending_effect"], "non_idempotent_write", "{dead:#}");
        assert_eq!(
            calls.of("create", &q),
            1,
            "trial {k}: the write reached the server once"
        );
        // V7 (amended): the call that reached the server has its row, shown incomplete.
        let rows = runwarden(&sandbox, &["--json", "audit", "list", "--run", &id])
            .await
            .ok()
            .json();
        let intents: Vec<&Value> = rows
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["action"] == "http_call_started"
                    && r["reason"]
                        .as_str()
                        .is_some_and(|t| t.ends_with("tools/call"))
            })
            .collect();
        assert_eq!(intents.len(), 1, "trial {k}: {rows:#}");
        assert_eq!(intents[0]["incomplete"], true, "trial {k}: {rows:#}");
    }
    // A second worker takes nothing: every trial's run is dead-lettered, never re-sent.
    let mut second = Child::worker(&sandbox, None);
    let sentinel = enqueue(&sandbox, "quick", "sentinel").await;
    let (outcome, before) = second.outcome_of(&sentinel).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert!(before.is_empty(), "{before:#?}");
    second.stop_idle().await;
    assert_eq!(calls.total("create"), ANSWERED_TRIALS, "0 duplicates");
    println!(
        "{ANSWERED_TRIALS} kill -9 trials between the answer and its record in {:.1?}: \
         {} writes, 0 duplicates, every call audited",
        started.elapsed(),
        calls.total("create"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_read_only_call_lets_another_worker_complete_the_run() {
    let plan = call_then_answer("search", "printer");
    let Install {
        sandbox,
        mut server,
        calls,
    } = install(&[("reader".to_string(), plan)]).await;
    let id = enqueue(&sandbox, "reader", "find the printer").await;

    let mut first = Child::worker(&sandbox, None);
    until_call_is_held(&mut server, "search", "printer").await;
    let held = status(&sandbox, &id).await;
    assert_eq!(held["status"], "running", "{held:#}");
    assert_eq!(
        held["pending_effect"],
        Value::Null,
        "a read-only call is not fenced: {held:#}"
    );
    // R3: the heartbeat renews the lease while the call is in flight, so the run is not
    // stale past the lease it was claimed with.
    past_lease_expiry(&held).await;
    let renewed = status(&sandbox, &id).await;
    assert_eq!(renewed["status"], "running", "{renewed:#}");
    assert_eq!(renewed["lease_holder"], held["lease_holder"], "{renewed:#}");
    assert!(
        renewed["lease_expires"].as_str() > held["lease_expires"].as_str(),
        "R3: renewed during the call: {held:#} then {renewed:#}"
    );
    let killed = Instant::now();
    first.signal("KILL");
    assert_eq!(first.ended(killed, WAIT).await.code, None);
    let stale = status(&sandbox, &id).await;
    past_lease_expiry(&stale).await;

    // The second worker's reaper requeues the run; the same worker then claims it.
    let mut second = Child::worker(&sandbox, None);
    second
        .until_stderr(&["the reaper recovered a stale run", &id, "Requeued"])
        .await;
    let (outcome, before) = second.outcome_of(&id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert!(before.is_empty(), "{before:#?}");
    second.stop_idle().await;

    let done = status(&sandbox, &id).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        done["attempts"], 2,
        "the dead worker's attempt and this one: {done:#}"
    );
    assert_eq!(done["requeue_count"], 1, "{done:#}");
    assert_ne!(
        done["lease_holder"], stale["lease_holder"],
        "another worker finished it: {done:#}"
    );
    assert_eq!(
        calls.of("search", "printer"),
        2,
        "a read-only call may run again"
    );
    let events = events(&sandbox, &id).await;
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
async fn racing_workers_in_threads_and_processes_claim_every_run_exactly_once() {
    const RUNS: usize = 40;
    let plan = call_then_answer("lookup", "instant");
    // The server is bound to a name: an unnamed field would be dropped at once.
    let Install {
        sandbox,
        calls,
        server: _server,
    } = install(&[("instant".to_string(), plan)]).await;
    let mut ids = BTreeSet::new();
    for n in 0..RUNS {
        ids.insert(enqueue(&sandbox, "instant", &format!("run {n}")).await);
    }

    // Three processes, four segments each, all racing for the same queued rows.
    let mut workers: Vec<Child> = (0..3).map(|_| Child::worker(&sandbox, Some(4))).collect();
    let (tx, mut merged) = mpsc::unbounded_channel::<(usize, Value)>();
    let mut feeds = Vec::new();
    for (w, worker) in workers.iter_mut().enumerate() {
        let mut stdout = std::mem::replace(&mut worker.stdout, mpsc::unbounded_channel().1);
        let tx = tx.clone();
        feeds.push(tokio::spawn(async move {
            while let Some(line) = stdout.recv().await {
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                let _ = tx.send((w, value));
            }
        }));
    }
    drop(tx);

    let mut finished: Vec<(usize, Value)> = Vec::new();
    let mut distinct = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while distinct.len() < RUNS {
        let (w, line) = tokio::time::timeout_at(deadline, merged.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {RUNS} runs finished in time", distinct.len()))
            .expect("the workers are running");
        distinct.insert(line["run_id"].as_str().unwrap().to_string());
        finished.push((w, line));
    }
    for worker in &mut workers {
        worker.signal("TERM");
    }
    let since = Instant::now();
    for worker in &mut workers {
        let ended = worker.ended(since, Duration::from_secs(2)).await;
        assert_eq!(ended.code, Some(0), "{ended:#?}");
    }
    for feed in feeds {
        feed.await.unwrap();
    }
    while let Some((w, line)) = merged.recv().await {
        if line["stopped"] != true {
            finished.push((w, line));
        }
    }

    let mut per_run: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    for (w, line) in &finished {
        per_run
            .entry(line["run_id"].as_str().unwrap().to_string())
            .or_default()
            .push((*w, line["outcome"].as_str().unwrap().to_string()));
    }
    assert_eq!(
        per_run.keys().cloned().collect::<BTreeSet<_>>(),
        ids,
        "every enqueued run, and only those"
    );
    for (id, seen) in &per_run {
        assert_eq!(
            seen.iter().map(|(_, o)| o.as_str()).collect::<Vec<_>>(),
            ["completed"],
            "run {id} ran once: {seen:?}"
        );
    }
    let by_worker: Vec<usize> = (0..3)
        .map(|w| finished.iter().filter(|(x, _)| *x == w).count())
        .collect();
    println!("{RUNS} runs over 3 workers x 4 slots: {by_worker:?} each");
    for id in &ids {
        let events = events(&sandbox, id).await;
        assert_eq!(
            kinds(&events)
                .iter()
                .filter(|k| **k == "run_started")
                .count(),
            1,
            "R3: claimed once: {events:#?}"
        );
        assert!(
            events
                .iter()
                .any(|e| e["kind"] == "tool_executed" && e["payload"]["outcome"] == "succeeded"),
            "the tool answered: {events:#?}"
        );
        assert_eq!(status(&sandbox, id).await["attempts"], 1);
    }
    assert_eq!(calls.total("lookup"), RUNS, "one tool call per run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_a_second_sigterm_exits_at_once() {
    let plan = call_then_answer("create", "held");
    let Install {
        sandbox,
        mut server,
        calls,
    } = install(&[("writer".to_string(), plan)]).await;
    let id = enqueue(&sandbox, "writer", "open a ticket").await;
    let mut worker = Child::worker(&sandbox, None);
    until_call_is_held(&mut server, "create", "held").await;
    let before = status(&sandbox, &id).await;

    worker.signal("TERM");
    worker.until_stderr(&["stopping: no new runs"]).await;
    // A stalled call reaches no boundary: past the lease it held when asked to stop, the
    // worker is still there, its heartbeat still renewing the lease, the call still open.
    past_lease_expiry(&before).await;
    assert!(
        !worker.has_exited(),
        "the first SIGTERM drains, it does not exit"
    );
    let during = status(&sandbox, &id).await;
    assert_eq!(during["status"], "running", "{during:#}");
    assert!(
        during["lease_expires"].as_str() > before["lease_expires"].as_str(),
        "R3: the heartbeat kept renewing during the drain: {before:#} then {during:#}"
    );
    let closed = server.drain_requests();
    assert!(
        closed.is_empty(),
        "no new request while draining: {closed:#?}"
    );
    assert!(
        !matches!(server.events.try_recv(), Ok(Seen::Closed(_))),
        "the call is still in flight"
    );

    let second = Instant::now();
    worker.signal("TERM");
    let ended = worker.ended(second, Duration::from_secs(2)).await;
    assert_eq!(ended.code, Some(0), "{ended:#?}");
    let report = summary(&ended);
    assert_eq!(report["abandoned"], 1, "left to its lease: {report}");
    assert_eq!(report["claimed"], 1, "{report}");
    let left = status(&sandbox, &id).await;
    assert_eq!(
        left["status"], "running",
        "the reaper recovers it later: {left:#}"
    );
    assert_eq!(left["pending_effect"], "non_idempotent_write", "{left:#}");
    assert_eq!(calls.of("create", "held"), 1);

    // A worker with no running segment exits at once on the first SIGTERM. It completes a
    // run first, so its signal handlers are certainly in place.
    let quick = enqueue(&sandbox, "quick", "hello").await;
    let mut idle = Child::worker(&sandbox, None);
    let (outcome, _) = idle.outcome_of(&quick).await;
    assert_eq!(outcome["outcome"], "completed");
    let ended = idle.stop_idle().await;
    assert_eq!(summary(&ended)["abandoned"], 0, "{ended:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_cancelled_before_any_worker_is_never_claimed() {
    let Install {
        sandbox,
        calls,
        server: _server,
    } = install(&[]).await;
    let id = enqueue(&sandbox, "quick", "never mind").await;
    let out = runwarden(&sandbox, &["--json", "cancel", &id]).await.ok();
    assert_eq!(out.json()["cancelled"], true, "{out:#?}");

    // A run enqueued after the cancelled one completes: the worker has been through the
    // queue, oldest first, and did not take the cancelled run.
    let later = enqueue(&sandbox, "quick", "later").await;
    let mut worker = Child::worker(&sandbox, None);
    let (outcome, before) = worker.outcome_of(&later).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert!(before.is_empty(), "nothing else ran: {before:#?}");
    let ended = worker.stop_idle().await;
    assert!(
        ended.stdout.iter().all(|l| !l.contains(&id)),
        "R4: never claimed: {ended:#?}"
    );
    assert_eq!(summary(&ended)["claimed"], 1, "{ended:#?}");

    let cancelled = status(&sandbox, &id).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    assert_eq!(cancelled["lease_holder"], Value::Null, "{cancelled:#}");
    // R8: its one event is the final one the cancel wrote: nothing ran.
    let log = events(&sandbox, &id).await;
    assert_eq!(kinds(&log), ["run_stopped"], "{log:#?}");
    assert_eq!(log[0]["payload"]["outcome"], "cancelled");
    assert_eq!(calls.total("lookup") + calls.total("create"), 0);
}
