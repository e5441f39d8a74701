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
use runwarden_runtime::queue::{Claim, QueueStore, RequeueApply, RescueApply};
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunEvent,
    RunFilter, RunSettle, SettleAnswer,
};
use runwarden_runtime::{
    CancelHub, DeadLetter, EFFECT_UNCERTAIN, Executor, ExecutorConfig, Outcome, RequeueAnswer,
    RetryPolicy, RunState, RunStore, SegmentOptions, StatusWatcher, WatcherConfig,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{HttpRequest, TestServer, mcp_handler, tool};
use runwarden_vault::audit::{AuditChain, AuditTip};
use runwarden_vault::store::{
    AuditFilter, RewrapFn, SealedKind, SealedMeta, SealedRecord, StoreError, StoreFault, VaultStore,
};
use runwarden_vault::{
    Algorithm, AuditEvent, AuditRow, EgressClient, EgressConfig, EgressPolicy, MasterKey, Vault,
};
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

/// The real store, failing the `n`th call (1-based, over the whole trial) of `method`,
/// and dying at the `crash_at`th async call of any method.
struct Faulty {
    inner: SqliteStore,
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

/// Runs `$call` on the inner store unless the fault strikes before it; strikes after it
/// by dropping its answer; a crash never returns.
macro_rules! faulty {
    ($self:ident, $method:literal, $call:expr) => {{
        let strike = $self.strike($method);
        if strike == Strike::Crash {
            return std::future::pending().await;
        }
        faulty!(@run $self, $method, strike, $call)
    }};
    (@run $self:ident, $method:literal, $strike:ident, $call:expr) => {{
        if $strike == Strike::Fail(When::Before) {
            return Err(Faulty::error($method));
        }
        let answer = $call;
        if $strike == Strike::Fail(When::After) {
            return Err(Faulty::error($method));
        }
        answer
    }};
}

#[async_trait]
impl RunStore for Faulty {
    async fn run_create(&self, params: RunCreate) -> Result<Run, StoreError> {
        self.inner.run_create(params).await
    }
    async fn run_get(&self, id: &str) -> Result<Option<Run>, StoreError> {
        faulty!(self, "run_get", self.inner.run_get(id).await)
    }
    async fn run_statuses(&self, ids: &[String]) -> Result<Vec<(String, RunState)>, StoreError> {
        // Both the status watcher's reads (the first question of every call) and the
        // step-boundary probe (R5) come here: a fault must read as "not cancelled".
        faulty!(self, "run_statuses", self.inner.run_statuses(ids).await)
    }
    fn change_feed(&self) -> &runwarden_runtime::ChangeFeed {
        self.inner.change_feed()
    }
    async fn run_cancel(&self, id: &str, now_ms: i64) -> Result<CancelAnswer, StoreError> {
        self.inner.run_cancel(id, now_ms).await
    }
    async fn run_heartbeat(&self, params: Heartbeat) -> Result<bool, StoreError> {
        faulty!(
            self,
            "run_heartbeat",
            self.inner.run_heartbeat(params).await
        )
    }
    async fn run_fence_mark(&self, params: FenceMark) -> Result<bool, StoreError> {
        faulty!(
            self,
            "run_fence_mark",
            self.inner.run_fence_mark(params).await
        )
    }
    async fn run_event_append(&self, params: EventAppend) -> Result<Option<i64>, StoreError> {
        faulty!(
            self,
            "run_event_append",
            self.inner.run_event_append(params).await
        )
    }
    async fn run_settle(&self, params: RunSettle) -> Result<SettleAnswer, StoreError> {
        faulty!(self, "run_settle", self.inner.run_settle(params).await)
    }
    async fn run_list(&self, filter: RunFilter) -> Result<Vec<Run>, StoreError> {
        self.inner.run_list(filter).await
    }
    async fn run_counts(&self) -> Result<Vec<(RunState, u64)>, StoreError> {
        self.inner.run_counts().await
    }
    async fn run_events(
        &self,
        id: &str,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<RunEvent>, StoreError> {
        faulty!(
            self,
            "run_events",
            self.inner.run_events(id, after_seq, limit).await
        )
    }
    async fn decision_ask(
        &self,
        params: runwarden_runtime::decision::DecisionAsk,
    ) -> Result<Option<i64>, StoreError> {
        faulty!(self, "decision_ask", self.inner.decision_ask(params).await)
    }
    async fn decision_answer(
        &self,
        params: runwarden_runtime::decision::DecisionAnswer,
    ) -> Result<runwarden_runtime::AnswerOutcome, StoreError> {
        self.inner.decision_answer(params).await
    }
    async fn decision_get(
        &self,
        id: &str,
    ) -> Result<Option<runwarden_runtime::Decision>, StoreError> {
        self.inner.decision_get(id).await
    }
    async fn decision_list(
        &self,
        filter: runwarden_runtime::DecisionFilter,
    ) -> Result<Vec<runwarden_runtime::Decision>, StoreError> {
        self.inner.decision_list(filter).await
    }
}

#[async_trait]
impl QueueStore for Faulty {
    async fn run_claim(&self, params: Claim) -> Result<Option<Run>, StoreError> {
        self.inner.run_claim(params).await
    }
    async fn run_requeue_apply(&self, params: RequeueApply) -> Result<RequeueAnswer, StoreError> {
        faulty!(
            self,
            "run_requeue_apply",
            self.inner.run_requeue_apply(params).await
        )
    }
    async fn run_stale(&self, now_ms: i64, limit: u32) -> Result<Vec<Run>, StoreError> {
        self.inner.run_stale(now_ms, limit).await
    }
    async fn run_rescue_apply(&self, params: RescueApply) -> Result<bool, StoreError> {
        self.inner.run_rescue_apply(params).await
    }
}

/// The vault's side: the audit appends can fail (V7: then nothing is sent) or die.
#[async_trait]
impl VaultStore for Faulty {
    async fn sealed_get(
        &self,
        kind: SealedKind,
        name: &str,
    ) -> Result<Option<SealedRecord>, StoreError> {
        self.inner.sealed_get(kind, name).await
    }
    async fn sealed_put(&self, record: SealedRecord) -> Result<(), StoreError> {
        self.inner.sealed_put(record).await
    }
    async fn sealed_insert_new(&self, record: SealedRecord) -> Result<bool, StoreError> {
        self.inner.sealed_insert_new(record).await
    }
    async fn sealed_delete(&self, kind: SealedKind, name: &str) -> Result<bool, StoreError> {
        self.inner.sealed_delete(kind, name).await
    }
    async fn sealed_list(&self, kind: SealedKind) -> Result<Vec<SealedMeta>, StoreError> {
        self.inner.sealed_list(kind).await
    }
    async fn sealed_secrets_version(&self) -> Result<u64, StoreError> {
        self.inner.sealed_secrets_version().await
    }
    async fn sealed_rewrap_all(&self, rewrap: RewrapFn) -> Result<usize, StoreError> {
        self.inner.sealed_rewrap_all(rewrap).await
    }
    async fn audit_append(
        &self,
        event: AuditEvent,
        chain: Arc<AuditChain>,
    ) -> Result<AuditRow, StoreError> {
        faulty!(
            self,
            "audit_append",
            self.inner.audit_append(event, chain).await
        )
    }
    async fn audit_append_many(
        &self,
        events: Vec<AuditEvent>,
        chain: Arc<AuditChain>,
    ) -> Result<Vec<AuditRow>, StoreError> {
        faulty!(
            self,
            "audit_append_many",
            self.inner.audit_append_many(events, chain).await
        )
    }
    async fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Result<Vec<i64>, StoreError> {
        self.inner.audit_incomplete(intent_ids).await
    }
    async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, StoreError> {
        self.inner.audit_list(filter).await
    }
    async fn audit_tip(&self) -> Result<Option<AuditTip>, StoreError> {
        self.inner.audit_tip().await
    }
    async fn audit_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.audit_counts().await
    }
    async fn oauth_lease_acquire(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        self.inner
            .oauth_lease_acquire(key, holder, now_ms, expires_ms)
            .await
    }
    async fn oauth_lease_release(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.inner.oauth_lease_release(key, holder).await
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
    let store = Arc::new(Faulty {
        inner: inner.clone(),
        fault,
        crash_at,
        calls: Mutex::default(),
        async_calls: AtomicUsize::new(0),
        crashed: Arc::default(),
        crashed_in: Mutex::default(),
    });
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
