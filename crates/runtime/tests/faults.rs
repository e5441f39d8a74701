//! The fault-injection matrix (R3, R5-R9, R11): a store that fails the Nth call of one
//! method, either before doing anything or after committing (the answer lost), driven over
//! queued runs of a write plan for each effect, with the reaper and later segments taking
//! over as they would after a crash. For every cell: the write reached the server at most
//! once (exactly once when the run completed), every request that reached the server has an
//! audit row, no cancellation was fabricated, the log has at most one terminal step, and
//! the run ends in a state the rules allow.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_runtime::queue::{Claim, QueueStore};
use runwarden_runtime::store::{NewRunStatus, Run, RunCreate};
use runwarden_runtime::{
    CancelHub, DeadLetter, EFFECT_UNCERTAIN, Executor, ExecutorConfig, Outcome, RetryPolicy,
    RunState, RunStore, SegmentOptions, StatusWatcher, WatcherConfig,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Call, Hook, HookedStore, HttpRequest, TestServer, mcp_handler, tool};
use runwarden_vault::store::{AuditFilter, StoreError, StoreFault};
use runwarden_vault::{Algorithm, EgressClient, EgressConfig, EgressPolicy, MasterKey, Vault};
use serde_json::{Value, json};

/// When the injected failure strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// The call fails and changes nothing.
    Before,
    /// The call does its work, commits, then answers an error (the answer was lost).
    After,
}

/// What a store call does in a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strike {
    /// Its work, as usual.
    Pass,
    /// The injected failure.
    Fail(When),
    /// The process dies here (kill -9): the call never returns and the segment is dropped.
    Crash,
}

/// The real store behind [`Faulty`].
type FaultyStore = HookedStore<SqliteStore, Faulty>;

/// The methods whose calls are counted, failed and crashed in: those a segment calls.
/// [`METHODS`] are failed at every call of a clean trial; `decision_ask` is only counted.
const STRUCK: [&str; 11] = [
    "audit_append",
    "audit_append_many",
    "run_get",
    "run_statuses",
    "run_heartbeat",
    "run_fence_mark",
    "run_event_append",
    "run_settle",
    "run_events",
    "run_requeue_apply",
    "decision_ask",
];

/// Fails the `n`th call (1-based, over the whole trial) of `method`, and dies at the
/// `crash_at`th call of any of the [`STRUCK`] methods.
#[derive(Default)]
struct Faulty {
    fault: Option<(&'static str, usize, When)>,
    crash_at: Option<usize>,
    calls: Mutex<HashMap<&'static str, usize>>,
    async_calls: AtomicUsize,
    crashed: Arc<tokio::sync::Notify>,
    /// The method the crash struck.
    crashed_in: Mutex<Option<&'static str>>,
}

impl Faulty {
    /// Counts a call and says what it does.
    fn strike(&self, method: &'static str) -> Strike {
        let n = self.async_calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_at == Some(n) {
            *self.crashed_in.lock().unwrap() = Some(method);
            self.crashed.notify_one();
            return Strike::Crash;
        }
        let mut calls = self.calls.lock().unwrap();
        let n = calls.entry(method).or_default();
        *n += 1;
        match self.fault {
            Some((m, at, when)) if m == method && at == *n => Strike::Fail(when),
            _ => Strike::Pass,
        }
    }

    fn error(method: &str) -> StoreError {
        StoreError::with_fault(
            method,
            StoreFault::Busy,
            "injected fault: database is locked",
        )
    }
}

#[async_trait]
impl Hook for Faulty {
    /// Both the status watcher's reads (the first question of every call) and the
    /// step-boundary probe (R5) are `run_statuses`: a fault there must read as "not
    /// cancelled". The audit appends can fail (V7: then nothing is sent) or die.
    async fn before(&self, call: &Call) -> runwarden_testkit::Strike {
        let Some(method) = STRUCK.iter().find(|m| **m == call.method) else {
            return runwarden_testkit::Strike::Pass;
        };
        match self.strike(method) {
            Strike::Pass => runwarden_testkit::Strike::Pass,
            Strike::Fail(When::Before) => runwarden_testkit::Strike::Fail(Faulty::error(method)),
            Strike::Fail(When::After) => runwarden_testkit::Strike::Lose(Faulty::error(method)),
            Strike::Crash => runwarden_testkit::Strike::Hang,
        }
    }
}

/// The methods a segment calls, each failed at every call it makes in a clean trial.
const METHODS: [&str; 10] = [
    "audit_append",
    "audit_append_many",
    "run_get",
    "run_statuses",
    "run_heartbeat",
    "run_fence_mark",
    "run_event_append",
    "run_settle",
    "run_events",
    "run_requeue_apply",
];

const LEASE: Duration = Duration::from_secs(30);

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What one trial left behind.
struct Trial {
    calls: HashMap<&'static str, usize>,
    async_calls: usize,
    writes: usize,
    requests: usize,
    audit_rows: usize,
    outcomes: Vec<Outcome>,
    unsent_steps: usize,
    row: Run,
    kinds: Vec<String>,
    crashed_in: Option<&'static str>,
}

/// One queued run of the plan "write, then answer" against a real MCP server, with the
/// fault armed, driven to its end: segments claim it, the reaper takes it when a segment
/// left it running (its lease "expires": the reaper is asked with a later clock).
async fn trial(
    effect: Effect,
    fault: Option<(&'static str, usize, When)>,
    crash_at: Option<usize>,
) -> Trial {
    let dir = tempfile::tempdir().unwrap();
    let inner = SqliteStore::open(dir.path().join("runwarden.db")).unwrap();
    let writes = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (w, r) = (writes.clone(), requests.clone());
    let normal = mcp_handler(vec![tool("create")], &[]);
    let server = TestServer::start(move |request: &HttpRequest| {
        r.fetch_add(1, Ordering::SeqCst);
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call" {
            w.fetch_add(1, Ordering::SeqCst);
        }
        normal(request)
    })
    .await;
    let faulty = Faulty {
        fault,
        crash_at,
        ..Faulty::default()
    };
    let store: Arc<FaultyStore> = Arc::new(HookedStore::new(Arc::new(inner.clone()), faulty));
    let vault = Vault::open(store.clone(), MasterKey::generate(), Algorithm::default())
        .await
        .unwrap()
        .with_anchor(dir.path().join("audit.anchor"));
    let vault = Arc::new(vault);
    let egress_config = EgressConfig {
        policy: EgressPolicy::new(&["127.0.0.1"]).unwrap(),
        ..EgressConfig::default()
    };
    let egress = Arc::new(EgressClient::new(vault.clone(), egress_config));
    let config = ExecutorConfig {
        lease: LEASE,
        // Often enough that the heartbeat is in the matrix, rare enough not to dominate it.
        heartbeat: Duration::from_millis(40),
        ..ExecutorConfig::new("faults")
    };
    // The process's status watcher reads through the faulty store too: the first question
    // of every call (which the segment waits for) is a store call of the matrix, faulted
    // and crashed at like any other. Its periodic refresh is left out (an hour): it runs
    // beside the segment, so a crash there would strike at an arbitrary instant of the
    // segment rather than at one of its store calls, which is not what a cell means. A
    // crash kills the process, watcher and all: the next segment runs in a new one.
    let process = || {
        let watcher = StatusWatcher::new(
            store.clone(),
            Arc::new(CancelHub::new()),
            WatcherConfig {
                interval: Duration::from_secs(3600),
            },
        );
        Executor::with_queue(store.clone(), watcher, config.clone())
    };
    let mut executor = process();
    let client = Arc::new(runwarden_mcp::McpClient::new(
        runwarden_mcp::ServerConfig::new("srv", server.url("/mcp")),
        egress.clone(),
    ));
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]}, {"text": "filed"}]);
    let agent = runwarden_runtime::AgentSpec {
        name: "helper".into(),
        system: None,
        max_rounds: 5,
        provider: Arc::new(runwarden_models::Scripted::from_json(&plan.to_string()).unwrap()),
        tools: vec![runwarden_runtime::BoundTool {
            spec: runwarden_models::ToolSpec {
                name: "srv__create".into(),
                description: None,
                input_schema: json!({"type": "object", "properties": {}}),
            },
            remote_name: "create".into(),
            effect,
            client,
            approval: None,
            output_schema: None,
        }],
        max_tokens: None,
        budgets: runwarden_runtime::Budgets::default(),
        policy: None,
        tags: Vec::new(),
    };
    let id = uuid::Uuid::now_v7().to_string();
    inner
        .run_create(RunCreate {
            id: id.clone(),
            agent: "helper".into(),
            correlation: id.clone(),
            request: Some(json!({"prompt": "go"})),
            status: NewRunStatus::Queued,
            now_ms: now(),
            origin: Default::default(),
        })
        .await
        .unwrap();
    let retry = RetryPolicy {
        max_requeues: 3,
        base: Duration::from_millis(1),
        max: Duration::from_millis(2),
    };
    let options = SegmentOptions {
        retry: Some(retry),
        drain: None,
        history: None,
        started: None,
    };
    let mut outcomes = Vec::new();
    // Each pass moves the clock a lease further, so backoffs are due and leases expired.
    for pass in 1..=8i64 {
        let later = now() + pass * 2 * LEASE.as_millis() as i64;
        runwarden_runtime::reap_at(&inner, &retry, later, 10, None)
            .await
            .unwrap();
        // A second later than the reaper's clock, so its backoff is due.
        let claim = Claim {
            owner: executor.owner().into(),
            lease_until_ms: later + LEASE.as_millis() as i64,
            now_ms: later + 1_000,
            agents: None,
            start: false,
        };
        let Some(run) = inner.run_claim(claim).await.unwrap() else {
            break;
        };
        let segment = tokio::time::timeout(
            Duration::from_secs(20),
            executor.execute_with(&run, &agent, "go", None, &options),
        );
        // A crash drops the segment where it stands, as kill -9 would.
        let crashed = tokio::select! {
            biased;
            _ = store.crashed.notified() => true,
            outcome = segment => {
                outcomes.push(outcome.expect("a segment ends"));
                false
            }
        };
        if crashed {
            executor = process();
        }
    }
    let audit_rows = vault
        .audit_list(AuditFilter::default())
        .await
        .unwrap()
        .len();
    let row = inner.run_get(&id).await.unwrap().unwrap();
    let events = inner.run_events(&id, 0, 0).await.unwrap();
    let unsent_steps = events
        .iter()
        .filter(|e| e.payload["delivery"] == "not_sent")
        .count();
    let kinds = events.into_iter().map(|e| e.kind).collect();
    let calls = store.calls.lock().unwrap().clone();
    Trial {
        calls,
        async_calls: store.async_calls.load(Ordering::SeqCst),
        writes: writes.load(Ordering::SeqCst),
        requests: requests.load(Ordering::SeqCst),
        audit_rows,
        outcomes,
        unsent_steps,
        row,
        kinds,
        crashed_in: *store.crashed_in.lock().unwrap(),
    }
}

/// The rules every cell must keep.
fn check(effect: Effect, fault: Option<(&'static str, usize, When)>, cell: &str, t: &Trial) {
    let why = || {
        format!(
            "{cell}: outcomes {:?}, row {:?}, log {:?}, crash in {:?}",
            t.outcomes, t.row, t.kinds, t.crashed_in
        )
    };
    if effect == Effect::NonIdempotentWrite {
        assert!(
            t.writes <= 1,
            "at most once: {} writes; {}",
            t.writes,
            why()
        );
    }
    if t.row.status == RunState::Completed {
        // A store fault is never the model's business: a call refused because its audit
        // row could not be written is retried, not answered, so a completed run made its
        // write and no step of it says "not sent".
        assert!(t.writes >= 1, "a completed run made its write; {}", why());
        assert_eq!(t.unsent_steps, 0, "no refusal reached the model; {}", why());
        if effect == Effect::NonIdempotentWrite {
            assert_eq!(t.writes, 1, "{}", why());
        }
    }
    // V7: every request that reached the server has an audit row.
    assert!(
        t.audit_rows >= t.requests,
        "{} requests, {} audit rows; {}",
        t.requests,
        t.audit_rows,
        why()
    );
    // R5, R6: a store fault reads as "not cancelled", never as a cancellation.
    assert!(!t.outcomes.contains(&Outcome::Cancelled), "{}", why());
    assert_ne!(t.row.status, RunState::Cancelled, "{}", why());
    assert!(
        !t.kinds
            .iter()
            .any(|k| k == "run_stopped" || k.ends_with("_cancelled")),
        "{}",
        why()
    );
    // R8: at most one terminal step.
    let terminal = t
        .kinds
        .iter()
        .filter(|k| *k == "run_completed" || *k == "run_failed")
        .count();
    assert!(terminal <= 1, "{terminal} terminal steps; {}", why());
    // The run ended, in a state the rules allow. A store fault is never NOT_RETRYABLE.
    assert!(t.row.status.is_terminal(), "the run ended; {}", why());
    // One truth per run: the row's status and the log's final event agree.
    let kinds: Vec<&str> = t.kinds.iter().map(String::as_str).collect();
    if let Err(disagree) = runwarden_runtime::check_row_matches_log(&t.row.id, t.row.status, &kinds)
    {
        panic!("{disagree}; {}", why());
    }
    if t.row.status == RunState::Failed {
        let reason = t.row.termination_reason.clone().unwrap_or_default();
        let allowed = [
            EFFECT_UNCERTAIN,
            DeadLetter::FencedWrite.as_str(),
            DeadLetter::RetriesExhausted.as_str(),
        ];
        assert!(
            allowed.iter().any(|code| reason.starts_with(code)),
            "failed with {reason:?}; {}",
            why()
        );
        // Only a non-idempotent write may end a run as fenced, and only one that left (R11:
        // the fence covers exactly the write), unless the store lost the answer to the
        // stamp itself, where the safe reading is that it holds.
        if reason.starts_with(DeadLetter::FencedWrite.as_str()) {
            assert_eq!(effect, Effect::NonIdempotentWrite, "{}", why());
            let stamp_lost = matches!(fault, Some(("run_fence_mark", _, When::After)));
            // The heartbeat runs beside the segment: a crash in it kills the process at an
            // arbitrary instant of the segment, which may fall between the stamp and the
            // send. Then nothing was sent and the fence rightly holds (the safe reading).
            let killed_beside = t.crashed_in == Some("run_heartbeat");
            assert!(
                t.writes == 1 || stamp_lost || killed_beside,
                "fenced without a write; {}",
                why()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_fault_and_crash_keeps_writes_at_most_once_audited_uncancelled_and_ending_by_the_rules()
 {
    let (mut faults, mut cells) = (0, 0);
    for effect in [
        Effect::ReadOnly,
        Effect::IdempotentWrite,
        Effect::NonIdempotentWrite,
    ] {
        let clean = trial(effect, None, None).await;
        assert_eq!(clean.row.status, RunState::Completed, "{:?}", clean.kinds);
        check(effect, None, "clean", &clean);
        let mut plans = vec![None];
        for method in METHODS {
            // Every call the clean run made, plus one: a fault can add a segment.
            let made = clean.calls.get(method).copied().unwrap_or(0);
            for n in 1..=made + 1 {
                for when in [When::Before, When::After] {
                    plans.push(Some((method, n, when)));
                }
            }
        }
        faults += plans.len() - 1;
        // Each fault alone, then with the process dying at every later store call (a fault
        // that is harmless in a segment that goes on can bite the segment that resumes).
        for fault in plans {
            let alone = trial(effect, fault, None).await;
            check(effect, fault, &format!("{effect:?} {fault:?}"), &alone);
            cells += 1;
            for crash in 1..=alone.async_calls {
                let t = trial(effect, fault, Some(crash)).await;
                check(
                    effect,
                    fault,
                    &format!("{effect:?} {fault:?} crash at call {crash}"),
                    &t,
                );
                cells += 1;
            }
        }
    }
    println!(
        "fault matrix: {cells} cells ({faults} injected faults over 3 effects, each alone and with a crash at every later store call)"
    );
    assert!(cells > 1_000, "the matrix covers the run: {cells} cells");
}
