//! `runwarden enqueue`, `worker`, `reap`, `cancel` and `status` as separate processes
//! sharing one SQLite file, against a real MCP server on 127.0.0.1 that counts the
//! `tools/call` requests it receives (R3, R9, R10): a worker killed with `kill -9` mid-call,
//! workers racing for the same rows, and the two-step SIGTERM.
//!
//! Leases are short (1 s, a heartbeat every 0.3 s, the reaper every 0.2 s) so a trial takes
//! about a lease. Waits are on the server's events, the children's output lines, or the
//! wall-clock lease expiry that `status --json` reports; never on a guessed sleep.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use runwarden_testkit::Seen;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::support::Live as Child;
use crate::support::fault_checks::ended_counts_match_rows;
use crate::support::workers::{
    Install, WAIT, WORKER_SETTINGS, call_then_answer, enqueue, events, install_in, kinds,
    past_lease_expiry, status, summary, until_call_is_held, write_agents,
};
use crate::support::{Sandbox, runwarden};

/// How many kill -9 trials the write test repeats.
const TRIALS: usize = 20;

/// An initialised sandbox (SQLite) with short leases, the counting server imported as
/// `srv` (`search` and `lookup` declared read-only), agent `quick` answering at once, and
/// one scripted agent per `(name, plan)`.
async fn install(agents: &[(String, Value)]) -> Install {
    install_in(Sandbox::initialised(), WORKER_SETTINGS, agents).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_non_idempotent_write_dead_letters_the_run_and_the_write_happens_once() {
    write_trials(TRIALS, None).await;
}

/// How many kill -9 trials the write test repeats under `process_crash` durability.
const PROCESS_CRASH_TRIALS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_process_crash_durability_kill_9_during_a_write_still_never_repeats_it() {
    // The faster mode skips the sync of the fence mark and the audit intent; both still
    // reach the operating system before the write leaves, so a killed worker loses neither.
    write_trials(PROCESS_CRASH_TRIALS, Some("process_crash")).await;
}

/// `trials` kill -9 trials of a worker holding a non-idempotent write on the wire, with
/// `[store] durability` set to `durability` when given.
async fn write_trials(trials: usize, durability: Option<&str>) {
    // One agent per trial, each sending its own argument, so the server counts per run.
    let agents = write_agents("w", "trial", trials);
    let Install {
        sandbox,
        mut server,
        calls,
    } = install(&agents).await;
    if let Some(durability) = durability {
        let text = std::fs::read_to_string(sandbox.config()).unwrap();
        assert!(
            text.contains("\n[store]\n"),
            "the template changed:\n{text}"
        );
        let text = text.replace(
            "\n[store]\n",
            &format!("\n[store]\ndurability = \"{durability}\"\n"),
        );
        std::fs::write(sandbox.config(), text).unwrap();
        let doctor = runwarden(&sandbox, &["doctor"]).await;
        doctor.says(&format!("durability: {durability}"));
    }
    let started = Instant::now();
    let mut runs = Vec::new();

    for (k, (agent, _)) in agents.iter().enumerate() {
        let q = format!("trial {k}");
        let id = enqueue(&sandbox, agent, &q).await;
        let mut first = Child::worker(&sandbox, None);
        if durability.is_some() && k == 0 {
            // The operator is told, at the default log level, what the mode gives up.
            first
                .until_stderr(&["durability = \"process_crash\"", "not synced to disk"])
                .await;
        }
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
        "{trials} kill -9 trials (durability {}) in {:.1?}: {dead_lettered} dead-lettered \
         FENCED_WRITE, {} tools/call to the write tool, {duplicates} duplicates",
        durability.unwrap_or("power_cut"),
        started.elapsed(),
        calls.total("create"),
    );
    assert_eq!(dead_lettered, trials);
    assert_eq!(calls.total("create"), trials);
    assert_eq!(duplicates, 0, "at most once (R9)");
    // Runs ended by the reaper of a worker, by `reap` and by a worker: each counted once.
    assert_eq!(ended_counts_match_rows(&sandbox.database()), Ok(()));
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
    // The killed attempt's claim recorded its start and its model step, but no tool
    // step; the second attempt resumed from them.
    assert_eq!(
        kinds,
        [
            "run_started",
            "model_response",
            "run_resumed",
            "tool_executed",
            "model_response",
            "run_completed"
        ],
        "{events:#?}"
    );
    assert_eq!(
        events[0]["payload"]["owner"], held["lease_holder"],
        "{events:#?}"
    );
    assert_eq!(
        events[2]["payload"]["owner"], done["lease_holder"],
        "{events:#?}"
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
