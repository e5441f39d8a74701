//! R3, R9 in process: workers claim queued runs, retries are classified and capped, the
//! reaper takes stale runs, and a segment that lost its lease stops without settling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_models::OpenAiCompatible;
use runwarden_runtime::queue::{Claim, QueueStore};
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{
    AgentError, AgentSource, AgentSpec, CancelAnswer, CancelHub, Executor, ExecutorConfig, Outcome,
    RetryPolicy, RunState, RunStore, SegmentOptions, StatusWatcher, StopLevel, WatcherConfig,
    Worker, WorkerConfig, reap,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{HttpReply, TestServer, mcp_handler, tool};
use serde_json::json;

use crate::support::{WAIT, fixture};

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn enqueue(store: &SqliteStore, agent: &str) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    store
        .run_create(RunCreate {
            id: id.clone(),
            agent: agent.into(),
            correlation: id.clone(),
            request: Some(json!({"prompt": "go"})),
            status: NewRunStatus::Queued,
            now_ms: now(),
            origin: Default::default(),
        })
        .await
        .unwrap();
    id
}

fn queue_executor(store: &SqliteStore, lease: Duration, heartbeat: Duration) -> Arc<Executor> {
    let config = ExecutorConfig {
        lease,
        heartbeat,
        ..ExecutorConfig::new("worker")
    };
    let store: Arc<SqliteStore> = Arc::new(store.clone());
    let watcher = StatusWatcher::new(
        store.clone(),
        Arc::new(CancelHub::new()),
        WatcherConfig::default(),
    );
    Arc::new(Executor::with_queue(store, watcher, config))
}

async fn claim(store: &SqliteStore, executor: &Executor) -> runwarden_runtime::Run {
    let claim = Claim {
        owner: executor.owner().into(),
        lease_until_ms: now() + executor.lease_ms(),
        now_ms: now(),
        agents: None,
        start: false,
    };
    store
        .run_claim(claim)
        .await
        .unwrap()
        .expect("a queued run is due")
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_requeues: 3,
        base: Duration::from_millis(1),
        max: Duration::from_millis(5),
    }
}

#[tokio::test]
async fn a_retryable_model_failure_requeues_and_a_permanent_one_dead_letters() {
    let f = fixture().await;
    let store = &*f.store.inner;
    let executor = queue_executor(store, Duration::from_secs(30), Duration::from_secs(10));
    for (status, expected, state) in [
        (503, Outcome::Requeued, RunState::Queued),
        (401, Outcome::DeadLettered, RunState::Failed),
    ] {
        let model = TestServer::start(move |_| {
            HttpReply::typed(status, "application/json", r#"{"error":{"message":"no"}}"#)
        })
        .await;
        let provider = Arc::new(OpenAiCompatible::new(
            f.egress.clone(),
            model.url("/v1"),
            "m",
        ));
        let agent = f.agent_with(provider, vec![]);
        let id = enqueue(store, "helper").await;
        let run = claim(store, &executor).await;
        assert_eq!(run.id, id);
        // A long backoff keeps the requeued run out of the next claim.
        let retry = RetryPolicy {
            base: Duration::from_secs(60),
            max: Duration::from_secs(60),
            ..fast_retry()
        };
        let options = SegmentOptions {
            retry: Some(retry),
            drain: None,
            history: None,
            started: None,
        };
        assert_eq!(
            executor
                .execute_with(&run, &agent, "go", None, &options)
                .await,
            expected,
            "HTTP {status}"
        );
        let row = store.run_get(&id).await.unwrap().unwrap();
        assert_eq!(row.status, state, "HTTP {status}");
        if status == 401 {
            assert!(row.termination_reason.unwrap().starts_with("NOT_RETRYABLE"));
        } else {
            assert_eq!((row.requeue_count, row.claimed_by), (1, None));
        }
    }
}

#[tokio::test]
async fn retries_stop_at_the_requeue_cap_with_retries_exhausted() {
    let f = fixture().await;
    let store = &*f.store.inner;
    let executor = queue_executor(store, Duration::from_secs(30), Duration::from_secs(10));
    let model = TestServer::start(|_| HttpReply::typed(503, "application/json", "{}")).await;
    let agent = f.agent_with(
        Arc::new(OpenAiCompatible::new(
            f.egress.clone(),
            model.url("/v1"),
            "m",
        )),
        vec![],
    );
    let id = enqueue(store, "helper").await;
    let options = SegmentOptions {
        retry: Some(fast_retry()),
        drain: None,
        history: None,
        started: None,
    };
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        let deadline = Instant::now() + WAIT;
        let run = loop {
            let claim = Claim {
                owner: executor.owner().into(),
                lease_until_ms: now() + 30_000,
                now_ms: now(),
                agents: None,
                start: false,
            };
            if let Some(run) = store.run_claim(claim).await.unwrap() {
                break run;
            }
            assert!(Instant::now() < deadline, "the retry never became due");
            tokio::task::yield_now().await;
        };
        outcomes.push(
            executor
                .execute_with(&run, &agent, "go", None, &options)
                .await,
        );
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Requeued,
            Outcome::Requeued,
            Outcome::Requeued,
            Outcome::DeadLettered
        ]
    );
    let row = store.run_get(&id).await.unwrap().unwrap();
    let reason = row.termination_reason.unwrap();
    assert!(reason.starts_with("RETRIES_EXHAUSTED"));
    let events = store.run_events(&id, 0, 0).await.unwrap();
    let requeued = events.iter().filter(|e| e.kind == "run_requeued").count();
    assert_eq!(requeued, 3, "one run_requeued step per requeue");
    let last = events.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.payload["reason"].as_str()),
        ("run_failed", Some(reason.as_str())),
        "the dead letter is the run's end in its log, with the row's reason"
    );
}

#[tokio::test]
async fn a_cancelled_queued_run_is_never_claimed() {
    let f = fixture().await;
    let store = &*f.store.inner;
    let id = enqueue(store, "helper").await;
    assert_eq!(
        store.run_cancel(&id, now()).await.unwrap(),
        CancelAnswer::Cancelled {
            previous: RunState::Queued
        }
    );
    let claim = Claim {
        owner: "w".into(),
        lease_until_ms: now() + 30_000,
        now_ms: now(),
        agents: None,
        start: false,
    };
    assert!(store.run_claim(claim).await.unwrap().is_none());
    assert_eq!(
        store.run_get(&id).await.unwrap().unwrap().request,
        None,
        "a cancel drops the stored request"
    );
}

#[tokio::test]
async fn a_segment_that_lost_its_lease_stops_without_settling_or_appending() {
    let f = fixture().await;
    let store = &*f.store.inner;
    let mut server = TestServer::start(mcp_handler(vec![tool("search")], &["search"])).await;
    // A lease far shorter than the heartbeat: the reaper will take the run mid-call.
    let executor = queue_executor(
        store,
        Duration::from_millis(200),
        Duration::from_millis(800),
    );
    let plan =
        json!([{"tool_calls": [{"name": "srv__search", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "search", Effect::ReadOnly)],
    );
    let id = enqueue(store, "helper").await;
    let run = claim(store, &executor).await;
    let (segment_executor, segment_run) = (executor.clone(), run.clone());
    let task = tokio::spawn(async move {
        let options = SegmentOptions {
            retry: Some(fast_retry()),
            drain: None,
            history: None,
            started: None,
        };
        segment_executor
            .execute_with(&segment_run, &agent, "go", None, &options)
            .await
    });
    loop {
        if String::from_utf8_lossy(&server.next_request(WAIT).await.body).contains("tools/call") {
            break;
        }
    }
    // The lease ends at a known wall-clock instant (nothing renews it before the 800 ms
    // heartbeat): wait for that instant, not for a condition.
    let expires = store
        .run_get(&id)
        .await
        .unwrap()
        .unwrap()
        .lease_expires_ms
        .unwrap();
    tokio::time::sleep(Duration::from_millis((expires - now() + 5).max(0) as u64)).await;
    let rescued = reap(store, &fast_retry()).await.unwrap();
    assert_eq!(rescued[0].id, id);
    let events_when_taken = store.run_events(&id, 0, 0).await.unwrap().len();
    server.next_close(WAIT).await; // the old owner's heartbeat fails and tears its call down
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::LeaseLost
    );
    let row = store.run_get(&id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.requeue_count),
        (RunState::Queued, 1),
        "the reaper's requeue stands"
    );
    assert_eq!(
        store.run_events(&id, 0, 0).await.unwrap().len(),
        events_when_taken,
        "the old owner appended nothing"
    );
}

/// Agents for workers: every name gets the same scripted plan against one server.
struct Agents {
    fixture_agent: std::sync::Mutex<Option<Box<dyn Fn() -> AgentSpec + Send>>>,
}

#[async_trait]
impl AgentSource for Agents {
    async fn agent(&self, _: &str) -> Result<AgentSpec, AgentError> {
        Ok((self.fixture_agent.lock().unwrap().as_ref().unwrap())())
    }
}

#[tokio::test]
async fn a_worker_claims_every_queued_run_exactly_once_and_completes_them() {
    let f = fixture().await;
    let store = (*f.store.inner).clone();
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let url = server.url("/mcp");
    let tool = f.tool(&url, "create", Effect::NonIdempotentWrite);
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let build = move || AgentSpec {
        name: "helper".into(),
        system: None,
        max_rounds: 5,
        provider: Arc::new(runwarden_models::Scripted::from_json(&plan.to_string()).unwrap()),
        tools: vec![tool.clone()],
        max_tokens: None,
        budgets: runwarden_runtime::Budgets::default(),
        policy: None,
        tags: Vec::new(),
    };
    let agents = Arc::new(Agents {
        fixture_agent: std::sync::Mutex::new(Some(Box::new(build))),
    });
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(enqueue(&store, "helper").await);
    }
    let executor = queue_executor(&store, Duration::from_secs(30), Duration::from_secs(10));
    let (outcome_tx, mut outcome_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::new(
        executor,
        f.store.clone(),
        agents,
        WorkerConfig {
            concurrency: 3,
            ..WorkerConfig::default()
        },
    )
    .with_observer(Arc::new(move |run, outcome| {
        let _ = outcome_tx.send((run.id.clone(), outcome));
    }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
    let handle = tokio::spawn(Arc::new(worker).run(stop_rx));
    let mut done = Vec::new();
    while done.len() < ids.len() {
        done.push(
            tokio::time::timeout(WAIT, outcome_rx.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    stop_tx.send(StopLevel::Drain).unwrap();
    let summary = tokio::time::timeout(WAIT, handle).await.unwrap().unwrap();
    assert_eq!(summary.claimed, 6);
    done.sort_by(|a, b| a.0.cmp(&b.0));
    let expected: Vec<(String, Outcome)> = ids
        .iter()
        .map(|id| (id.clone(), Outcome::Completed))
        .collect();
    assert_eq!(done, expected, "each run claimed once and completed");
    let calls = server
        .drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("tools/call"))
        .count();
    assert_eq!(calls, 6, "one write per run, no duplicates");
    // Three free slots at the start: the first claim takes three runs in one trip.
    let at_once = f.store.claimed_at_once.lock().unwrap().clone();
    assert_eq!(at_once.first(), Some(&3), "{at_once:?}");
    assert_eq!(at_once.iter().sum::<usize>(), 6, "{at_once:?}");
}

/// An agent source that fails the same way every time (EMFILE and a store fault during
/// the catalogue read cannot be caused on demand in a test process).
struct Failing(AgentError);

#[async_trait]
impl AgentSource for Failing {
    async fn agent(&self, _: &str) -> Result<AgentSpec, AgentError> {
        Err(self.0.clone())
    }
}

/// One worker segment over one queued run with `agents`; answers the outcome and the row.
async fn one_segment(agents: Failing) -> (Outcome, runwarden_runtime::Run) {
    let f = fixture().await;
    let store = (*f.store.inner).clone();
    let id = enqueue(&store, "helper").await;
    let executor = queue_executor(&store, Duration::from_secs(30), Duration::from_secs(10));
    let (outcome_tx, mut outcome_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::new(
        executor,
        Arc::new(store.clone()),
        Arc::new(agents),
        WorkerConfig {
            concurrency: 1,
            retry: RetryPolicy {
                max_requeues: 0,
                base: Duration::from_secs(60),
                max: Duration::from_secs(60),
            },
            ..WorkerConfig::default()
        },
    )
    .with_observer(Arc::new(move |_, outcome| {
        let _ = outcome_tx.send(outcome);
    }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
    let handle = tokio::spawn(Arc::new(worker).run(stop_rx));
    let outcome = tokio::time::timeout(WAIT, outcome_rx.recv())
        .await
        .unwrap()
        .unwrap();
    stop_tx.send(StopLevel::Drain).unwrap();
    tokio::time::timeout(WAIT, handle).await.unwrap().unwrap();
    let claim = Claim {
        owner: "another".into(),
        lease_until_ms: now() + 30_000,
        now_ms: now(),
        agents: None,
        start: false,
    };
    let due_now = store.run_claim(claim).await.unwrap();
    assert!(due_now.is_none(), "a run handed back waits for its backoff");
    (outcome, store.run_get(&id).await.unwrap().unwrap())
}

#[tokio::test]
async fn the_reaper_folds_the_run_counts_at_each_pass() {
    let f = fixture().await;
    let store = (*f.store.inner).clone();
    let executor = queue_executor(&store, Duration::from_secs(30), Duration::from_secs(10));
    let worker = Worker::new(
        executor,
        f.store.clone(),
        Arc::new(Failing(AgentError::Invalid("no run is queued".into()))),
        WorkerConfig {
            concurrency: 1,
            reap_every: Duration::from_millis(20),
            ..WorkerConfig::default()
        },
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
    let handle = tokio::spawn(Arc::new(worker).run(stop_rx));
    // Two passes, so it is each pass and not only the first; a store nobody scrapes still
    // has its changes moved.
    for pass in 1..=2 {
        tokio::time::timeout(WAIT, f.store.folds.notified())
            .await
            .unwrap_or_else(|_| panic!("pass {pass} folded no run counts"));
    }
    stop_tx.send(StopLevel::Drain).unwrap();
    tokio::time::timeout(WAIT, handle).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_agent_unavailable_for_now_goes_back_to_the_queue_without_spending_the_budget() {
    let problem = "store error while listing the catalogue: too many open files".to_string();
    let (outcome, row) = one_segment(Failing(AgentError::Unavailable(problem))).await;
    assert_eq!(outcome, Outcome::Requeued);
    // With a budget of zero, a counting requeue would have dead-lettered it.
    assert_eq!((row.status, row.requeue_count), (RunState::Queued, 0));
    let reason = row.termination_reason.unwrap_or_default();
    assert!(reason.starts_with("waiting to retry"), "{reason}");
    assert!(!reason.contains("NOT_RETRYABLE"), "{reason}");
}

#[tokio::test]
async fn an_agent_the_configuration_cannot_run_is_dead_lettered_not_retryable() {
    let problem = "pattern srv__* matches no imported tool".to_string();
    let (outcome, row) = one_segment(Failing(AgentError::Invalid(problem))).await;
    assert_eq!(outcome, Outcome::DeadLettered);
    assert_eq!(row.status, RunState::Failed);
    assert!(row.termination_reason.unwrap().starts_with("NOT_RETRYABLE"));
}
