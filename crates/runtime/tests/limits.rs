//! R14 end to end on a real SQLite file: a call over a full limit waits (its wait on the
//! run's log), goes when a slot frees, fails unsent past its bound, ends its wait at once
//! on a cancel; limits hold across two handles of the file (two processes), and a slot
//! whose holder stopped renewing comes back after its lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runwarden_mcp::Effect;
use runwarden_runtime::limits::{
    Limit, LimitKey, LimitKind, LimitStore, LimitTake, Limiter, Limits, TakeAttempt,
};
use runwarden_runtime::rules::limits::LimitRule;
use runwarden_runtime::{Executor, ExecutorConfig, Observer, Outcome, RunEvent, RunStore};
use runwarden_testkit::{TestServer, mcp_handler, tool};
use runwarden_vault::CancellationSignal;
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::{Fixture, WAIT, fixture};

fn slots(k: u32, max_wait: Duration) -> Limit {
    Limit {
        rule: LimitRule {
            concurrency: Some(k),
            rate_per_second: None,
            burst: 1,
        },
        max_wait,
    }
}

fn server_limit(limit: Limit) -> Limits {
    let mut limits = Limits::default();
    limits
        .limits
        .insert(LimitKey::new(LimitKind::Server, "srv"), limit);
    limits
}

/// An executor of the fixture's store whose calls are under `limits`, kept in another
/// handle of the same file.
fn limited(f: &Fixture, limits: Limits) -> (Arc<Executor>, Arc<Limiter>) {
    let store: Arc<dyn LimitStore> = Arc::new(f.other_process());
    let limiter = Arc::new(Limiter::new(limits, store));
    let executor = Executor::new(
        f.store.clone(),
        f.watcher.clone(),
        ExecutorConfig::new("limited"),
    )
    .with_limiter(limiter.clone());
    (Arc::new(executor), limiter)
}

/// An observer that sends every recorded event's kind.
fn kinds_seen() -> (Observer, mpsc::UnboundedReceiver<RunEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let observer: Observer = Arc::new(move |event: &RunEvent| {
        let _ = tx.send(event.clone());
    });
    (observer, rx)
}

async fn next_of_kind(events: &mut mpsc::UnboundedReceiver<RunEvent>, kind: &str) -> RunEvent {
    tokio::time::timeout(WAIT, async {
        loop {
            let event = events.recv().await.expect("the run goes on");
            if event.kind == kind {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind} event"))
}

/// Another process holds the server's only slot, and never lets go.
async fn slot_taken_elsewhere(f: &Fixture) {
    let other = f.other_process();
    let now = runwarden_base::now_ms();
    let answer = other
        .limit_take(LimitTake {
            holder: "another-process".into(),
            limits: vec![("server:srv".into(), slots(1, WAIT).rule)],
            now_ms: now,
            hold_until_ms: now + 600_000,
        })
        .await
        .unwrap();
    assert!(matches!(
        answer,
        runwarden_runtime::rules::limits::TakeDecision::Take { .. }
    ));
}

fn tools_calls(server: &mut TestServer) -> usize {
    server
        .drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_over_a_full_limit_waits_on_the_log_and_goes_when_the_slot_is_released() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &["create"])).await;
    let (executor, _) = limited(&f, server_limit(slots(1, WAIT)));
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let tools = vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)];
    let (first, second) = (
        executor.create_sync("helper", "go").await.unwrap(),
        executor.create_sync("helper", "go").await.unwrap(),
    );
    let (exec, agent, run) = (
        executor.clone(),
        f.agent(plan.clone(), tools.clone()),
        first.clone(),
    );
    let first_task = tokio::spawn(async move { exec.execute(&run, &agent, "go", None).await });
    // The first call holds the slot on the wire (the tool stalls).
    loop {
        let request = server.next_request(WAIT).await;
        if String::from_utf8_lossy(&request.body).contains("\"tools/call\"") {
            break;
        }
    }
    let (observer, mut second_events) = kinds_seen();
    let (exec, agent, run) = (executor.clone(), f.agent(plan, tools), second.clone());
    let second_task =
        tokio::spawn(async move { exec.execute(&run, &agent, "go", Some(observer)).await });
    let wait = next_of_kind(&mut second_events, "limit_wait").await;
    assert_eq!(wait.payload["call"], "srv__create");
    assert_eq!(
        wait.payload["limit"],
        "concurrency limit of server srv (1 at once)"
    );
    assert_eq!(tools_calls(&mut server), 0, "the waiting call sent nothing");
    // The first run is cancelled: its call is torn down and its slot released.
    executor.cancel(&first.id).await.unwrap();
    let waited = next_of_kind(&mut second_events, "limit_waited").await;
    assert_eq!(waited.payload["outcome"], "taken");
    loop {
        let request = server.next_request(WAIT).await;
        if String::from_utf8_lossy(&request.body).contains("\"tools/call\"") {
            break;
        }
    }
    assert_eq!(
        tokio::time::timeout(WAIT, first_task)
            .await
            .unwrap()
            .unwrap(),
        Outcome::Cancelled
    );
    executor.cancel(&second.id).await.unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, second_task)
            .await
            .unwrap()
            .unwrap(),
        Outcome::Cancelled
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_during_a_limit_wait_ends_the_wait_at_once_and_sends_nothing() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let (executor, _) = limited(&f, server_limit(slots(1, WAIT)));
    slot_taken_elsewhere(&f).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = executor.create_sync("helper", "go").await.unwrap();
    let (observer, mut events) = kinds_seen();
    let (exec, task_run) = (executor.clone(), run.clone());
    let task =
        tokio::spawn(async move { exec.execute(&task_run, &agent, "go", Some(observer)).await });
    next_of_kind(&mut events, "limit_wait").await;
    let issued = Instant::now();
    executor.cancel(&run.id).await.unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Cancelled
    );
    // Generous bound: woken in-process this takes milliseconds (the benchmark measures it).
    let took = issued.elapsed();
    assert!(took < Duration::from_millis(500), "took {took:?}");
    let waited = next_of_kind(&mut events, "limit_waited").await;
    assert_eq!(waited.payload["outcome"], "cancelled");
    assert_eq!(tools_calls(&mut server), 0, "nothing was sent");
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.pending_effect, None, "no fence was stamped");
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_max_wait_a_call_fails_unsent_and_the_model_reads_why() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let (executor, _) = limited(&f, server_limit(slots(1, Duration::from_millis(300))));
    slot_taken_elsewhere(&f).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "gave up"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = executor.create_sync("helper", "go").await.unwrap();
    let outcome = executor.execute(&run, &agent, "go", None).await;
    assert_eq!(
        outcome,
        Outcome::Completed,
        "the model read the error and answered"
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "model_response",
            "limit_wait",
            "limit_waited",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
    assert_eq!(events[3].payload["outcome"], "timed_out");
    let step = &events[4].payload;
    assert_eq!(step["outcome"], "refused");
    assert_eq!(
        step["text"],
        "concurrency limit of server srv (1 at once): waited 0s, try again later"
    );
    assert_eq!(tools_calls(&mut server), 0, "nothing was sent");
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.pending_effect, None, "no fence was stamped");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_limits_a_call_reads_nothing_for_them_and_runs_as_before() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let (executor, _) = limited(&f, Limits::default());
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    assert_eq!(
        f.kinds(&run.id).await,
        [
            "run_started",
            "model_response",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
}

/// A signal that never cancels.
struct Never;

impl CancellationSignal for Never {
    fn is_cancelled(&self) -> bool {
        false
    }
}

async fn take(limiter: &Limiter, agent: &str) -> runwarden_runtime::limits::Hold {
    let plan = limiter.for_tool(agent, None, "srv", "srv__create");
    match limiter.try_take(&plan).await.unwrap() {
        TakeAttempt::Taken(hold) => hold,
        TakeAttempt::Full(full) => limiter.wait(&plan, full, &Never).await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn n_calls_on_two_processes_against_a_limit_of_k_never_hold_more_than_k() {
    let f = fixture().await;
    let limits = server_limit(slots(3, WAIT));
    let limiters = [
        Arc::new(Limiter::new(limits.clone(), Arc::new(f.other_process()))),
        Arc::new(Limiter::new(limits, Arc::new(f.other_process()))),
    ];
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut calls = Vec::new();
    for n in 0..12 {
        let limiter = limiters[n % 2].clone();
        let (inside, most) = (inside.clone(), most.clone());
        calls.push(tokio::spawn(async move {
            let hold = take(&limiter, "helper").await;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // The call's work: long enough for the others to pile up behind the limit.
            tokio::time::sleep(Duration::from_millis(30)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            hold.release().await;
        }));
    }
    for call in calls {
        tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 3, "K at once, never more");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slot_whose_holder_stopped_renewing_comes_back_after_its_lease() {
    let f = fixture().await;
    let mut limits = server_limit(slots(1, WAIT));
    limits.hold_lease = Some(Duration::from_millis(600));
    let limiter = Limiter::new(limits, Arc::new(f.other_process()));
    // A holder that died: its row was written with a short lease and is never renewed.
    let other = f.other_process();
    let now = runwarden_base::now_ms();
    other
        .limit_take(LimitTake {
            holder: "killed".into(),
            limits: vec![("server:srv".into(), slots(1, WAIT).rule)],
            now_ms: now,
            hold_until_ms: now + 600,
        })
        .await
        .unwrap();
    let started = Instant::now();
    let hold = take(&limiter, "helper").await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "the slot came back after {took:?}"
    );
    // A live holder renews: past several leases its slot is still held.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        other
            .limit_holders("server:srv", runwarden_base::now_ms())
            .await
            .unwrap(),
        1,
        "the live hold was renewed"
    );
    hold.release().await;
    assert_eq!(
        other
            .limit_holders("server:srv", runwarden_base::now_ms())
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limit_shared_by_two_processes_holds_its_rate() {
    let f = fixture().await;
    let mut limits = Limits::default();
    limits.limits.insert(
        LimitKey::new(LimitKind::Tool, "srv__create"),
        Limit {
            rule: LimitRule {
                concurrency: None,
                rate_per_second: Some(20.0),
                burst: 1,
            },
            max_wait: WAIT,
        },
    );
    let limiters = [
        Arc::new(Limiter::new(limits.clone(), Arc::new(f.other_process()))),
        Arc::new(Limiter::new(limits, Arc::new(f.other_process()))),
    ];
    let taken = Arc::new(AtomicUsize::new(0));
    let window = Duration::from_secs(2);
    let started = Instant::now();
    let mut callers = Vec::new();
    for n in 0..6 {
        let (limiter, taken) = (limiters[n % 2].clone(), taken.clone());
        callers.push(tokio::spawn(async move {
            while started.elapsed() < window {
                take(&limiter, "helper").await;
                if started.elapsed() <= window {
                    taken.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for caller in callers {
        tokio::time::timeout(WAIT, caller).await.unwrap().unwrap();
    }
    // 20 per second for 2 s and the burst of 1: 41 at most; a few lost to timing.
    let taken = taken.load(Ordering::SeqCst);
    assert!((36..=41).contains(&taken), "took {taken} in {window:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_call_past_its_max_wait_fails_the_run_retryably_with_nothing_sent() {
    let f = fixture().await;
    let mut limits = Limits::default();
    limits.limits.insert(
        LimitKey::new(LimitKind::Agent, "helper"),
        slots(1, Duration::from_millis(200)),
    );
    let (executor, _) = limited(&f, limits);
    let other = f.other_process();
    let now = runwarden_base::now_ms();
    other
        .limit_take(LimitTake {
            holder: "another-process".into(),
            limits: vec![("agent:helper".into(), slots(1, WAIT).rule)],
            now_ms: now,
            hold_until_ms: now + 600_000,
        })
        .await
        .unwrap();
    let agent = f.agent(json!([{"text": "never asked"}]), vec![]);
    let run = executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "limit_wait",
            "limit_waited",
            "model_failed",
            "run_failed"
        ]
    );
    let failed = &events[3].payload;
    assert_eq!(failed["retryable"], true);
    assert_eq!(failed["delivery"], "not_sent");
    assert_eq!(
        failed["error"],
        "concurrency limit of agent helper (1 at once): waited 0s, try again later"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tokens_limit_holds_the_runs_it_started_and_no_other() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let mut limits = Limits::default();
    limits.limits.insert(
        LimitKey::new(LimitKind::Token, "ci"),
        slots(1, Duration::from_millis(200)),
    );
    let (executor, _) = limited(&f, limits);
    let other = f.other_process();
    let now = runwarden_base::now_ms();
    other
        .limit_take(LimitTake {
            holder: "another-run-of-ci".into(),
            limits: vec![("token:ci".into(), slots(1, WAIT).rule)],
            now_ms: now,
            hold_until_ms: now + 600_000,
        })
        .await
        .unwrap();
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let tools = vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)];
    let started_by = |token: Option<&str>| runwarden_runtime::RunOrigin {
        started_by: token.map(str::to_string),
        tags: vec![],
    };
    let budgets = runwarden_runtime::Budgets::default();
    let by_ci = executor
        .create_sync_with("helper", "go", &budgets, started_by(Some("ci")))
        .await
        .unwrap();
    let by_hand = executor
        .create_sync_with("helper", "go", &budgets, started_by(None))
        .await
        .unwrap();
    // Every call of a run the token started is held, its model call first.
    for (run, ends) in [(&by_ci, Outcome::Failed), (&by_hand, Outcome::Completed)] {
        let agent = f.agent(plan.clone(), tools.clone());
        assert_eq!(executor.execute(run, &agent, "go", None).await, ends);
    }
    let of_kind = |events: Vec<RunEvent>, kind: &str| {
        events.into_iter().find(|e| e.kind == kind).unwrap().payload
    };
    let refused = of_kind(
        f.store.run_events(&by_ci.id, 0, 0).await.unwrap(),
        "model_failed",
    );
    assert_eq!(
        refused["error"],
        "concurrency limit of token ci (1 at once): waited 0s, try again later"
    );
    let made = of_kind(
        f.store.run_events(&by_hand.id, 0, 0).await.unwrap(),
        "tool_executed",
    );
    assert_eq!(made["outcome"], "succeeded", "{made}");
}

#[tokio::test]
async fn limits_put_in_force_by_a_reload_hold_the_calls_that_plan_after_it() {
    let f = fixture().await;
    let (_, limiter) = limited(&f, Limits::default());
    let plan = || limiter.for_tool("helper", None, "srv", "srv__create");
    assert!(
        plan().is_empty(),
        "no limit configured: the call plans nothing"
    );

    limiter.set_limits(server_limit(slots(1, Duration::ZERO)));
    let first = match limiter.try_take(&plan()).await.unwrap() {
        TakeAttempt::Taken(hold) => hold,
        TakeAttempt::Full(full) => panic!("the only slot is free: {full:?}"),
    };
    assert!(
        matches!(
            limiter.try_take(&plan()).await.unwrap(),
            TakeAttempt::Full(_)
        ),
        "the reloaded limit of one holds the second call"
    );

    // Lifted again: a new call plans nothing, the held slot is released as usual.
    limiter.set_limits(Limits::default());
    assert!(plan().is_empty());
    first.release().await;
}
