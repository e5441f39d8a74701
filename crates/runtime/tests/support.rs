//! Fixtures for the runtime tests: a real SQLite store behind a thin wrapper that counts
//! (and, when told, fails or holds) status reads and step records; a vault; MCP servers on
//! 127.0.0.1.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use runwarden_mcp::{Effect, McpClient, ServerConfig};
use runwarden_models::{ModelProvider, Scripted, ToolSpec};
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, Run, RunCreate, RunEvent, RunSettle,
    SettleAnswer,
};
use runwarden_runtime::{
    AgentSpec, BoundTool, CancelHub, Executor, ExecutorConfig, RunState, RunStore, StatusWatcher,
    WatcherConfig,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::store::{AuditFilter, StoreError};
use runwarden_vault::{EgressClient, Vault};
use serde_json::json;

pub const WAIT: Duration = Duration::from_secs(10);

/// The real store, counting status reads (each one batched query), failing them or
/// tool-step records on demand.
pub struct Instrumented {
    pub inner: SqliteStore,
    /// Batched status queries (`run_statuses` calls), whatever their size.
    pub status_reads: AtomicUsize,
    /// The ids of the largest one.
    pub largest_read: AtomicUsize,
    /// Announces every status query as it starts.
    pub read_started: tokio::sync::Notify,
    /// Gets a permit each time a status query has read the store (before it answers).
    pub read_done: tokio::sync::Notify,
    /// Held by a test to keep status queries from answering after they read.
    pub hold_answers: tokio::sync::Mutex<()>,
    pub fail_probes: AtomicBool,
    pub fail_tool_steps: AtomicBool,
    /// Event kinds whose appends fail (a full disk, a locked database).
    pub fail_kinds: std::sync::Mutex<Vec<String>>,
    /// Lease renewals never answer (a store that hangs).
    pub hang_heartbeats: AtomicBool,
}

#[async_trait]
impl RunStore for Instrumented {
    async fn run_create(&self, params: RunCreate) -> Result<Run, StoreError> {
        self.inner.run_create(params).await
    }
    async fn run_get(&self, id: &str) -> Result<Option<Run>, StoreError> {
        self.inner.run_get(id).await
    }
    async fn run_statuses(&self, ids: &[String]) -> Result<Vec<(String, RunState)>, StoreError> {
        self.status_reads.fetch_add(1, Ordering::SeqCst);
        self.largest_read.fetch_max(ids.len(), Ordering::SeqCst);
        self.read_started.notify_waiters();
        if self.fail_probes.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                "reading a run's status",
                "injected failure",
            ));
        }
        let read = self.inner.run_statuses(ids).await;
        self.read_done.notify_one();
        drop(self.hold_answers.lock().await);
        read
    }
    fn change_feed(&self) -> &runwarden_runtime::ChangeFeed {
        self.inner.change_feed()
    }
    async fn run_cancel(&self, id: &str, now_ms: i64) -> Result<CancelAnswer, StoreError> {
        self.inner.run_cancel(id, now_ms).await
    }
    async fn run_heartbeat(&self, params: Heartbeat) -> Result<bool, StoreError> {
        if self.hang_heartbeats.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.run_heartbeat(params).await
    }
    async fn run_fence_mark(&self, params: FenceMark) -> Result<bool, StoreError> {
        self.inner.run_fence_mark(params).await
    }
    async fn run_event_append(&self, params: EventAppend) -> Result<Option<i64>, StoreError> {
        let failing_kind = self.fail_kinds.lock().unwrap().contains(&params.kind);
        if failing_kind
            || params.kind == "tool_executed" && self.fail_tool_steps.load(Ordering::SeqCst)
        {
            return Err(StoreError::new(
                "appending a run event",
                "injected failure: the disk is full",
            ));
        }
        self.inner.run_event_append(params).await
    }
    async fn run_settle(&self, params: RunSettle) -> Result<SettleAnswer, StoreError> {
        self.inner.run_settle(params).await
    }
    async fn run_list(
        &self,
        filter: runwarden_runtime::store::RunFilter,
    ) -> Result<Vec<Run>, StoreError> {
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
        self.inner.run_events(id, after_seq, limit).await
    }
    async fn decision_ask(
        &self,
        params: runwarden_runtime::decision::DecisionAsk,
    ) -> Result<Option<i64>, StoreError> {
        self.inner.decision_ask(params).await
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

/// A vault, an egress client admitting loopback, an instrumented store and an executor.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub store: Arc<Instrumented>,
    pub vault: Arc<Vault>,
    pub egress: Arc<EgressClient>,
    pub hub: Arc<CancelHub>,
    pub watcher: StatusWatcher,
    pub executor: Arc<Executor>,
}

pub async fn fixture() -> Fixture {
    fixture_with(WatcherConfig::default()).await
}

/// A fixture whose status watcher refreshes as `config` says.
pub async fn fixture_with(config: WatcherConfig) -> Fixture {
    let runwarden_testkit::LoopbackVault {
        dir,
        store: inner,
        vault,
        egress,
    } = runwarden_testkit::loopback_vault().await;
    let store = Arc::new(Instrumented {
        inner,
        status_reads: AtomicUsize::new(0),
        largest_read: AtomicUsize::new(0),
        read_started: tokio::sync::Notify::new(),
        read_done: tokio::sync::Notify::new(),
        hold_answers: tokio::sync::Mutex::new(()),
        fail_probes: AtomicBool::new(false),
        fail_tool_steps: AtomicBool::new(false),
        fail_kinds: std::sync::Mutex::new(Vec::new()),
        hang_heartbeats: AtomicBool::new(false),
    });
    let hub = Arc::new(CancelHub::new());
    let watcher = StatusWatcher::new(store.clone(), hub.clone(), config);
    let executor = Arc::new(Executor::new(
        store.clone(),
        watcher.clone(),
        ExecutorConfig::new("test"),
    ));
    Fixture {
        dir,
        store,
        vault,
        egress,
        hub,
        watcher,
        executor,
    }
}

impl Fixture {
    /// A tool of server `srv` at `url` with the given effect.
    pub fn tool(&self, url: &str, remote: &str, effect: Effect) -> BoundTool {
        // These fixtures' servers speak the 2025-11-25 session protocol (the handshake
        // legs are what the delivery tests look at).
        let client = Arc::new(McpClient::new(
            ServerConfig::new("srv", url).with_protocol(runwarden_mcp::ProtocolPolicy::Handshake),
            self.egress.clone(),
        ));
        BoundTool {
            spec: ToolSpec {
                name: format!("srv__{remote}"),
                description: None,
                input_schema: json!({"type": "object", "properties": {}}),
            },
            remote_name: remote.to_string(),
            effect,
            client,
            approval: None,
            output_schema: None,
        }
    }

    /// A tool of server `srv` at `url` whose operations have `budget` each (M3).
    pub fn tool_with_budget(
        &self,
        url: &str,
        remote: &str,
        effect: Effect,
        budget: Duration,
    ) -> BoundTool {
        let mut server =
            ServerConfig::new("srv", url).with_protocol(runwarden_mcp::ProtocolPolicy::Handshake);
        server.timeout = budget;
        BoundTool {
            client: Arc::new(McpClient::new(server, self.egress.clone())),
            ..self.tool(url, remote, effect)
        }
    }

    /// An agent with a scripted plan (JSON) and tools.
    pub fn agent(&self, plan: serde_json::Value, tools: Vec<BoundTool>) -> AgentSpec {
        self.agent_with(
            Arc::new(Scripted::from_json(&plan.to_string()).unwrap()),
            tools,
        )
    }

    pub fn agent_with(&self, provider: Arc<dyn ModelProvider>, tools: Vec<BoundTool>) -> AgentSpec {
        AgentSpec {
            name: "helper".into(),
            system: None,
            max_rounds: 20,
            provider,
            tools,
            max_tokens: None,
            budgets: runwarden_runtime::Budgets::default(),
        }
    }

    /// Stores steps as an earlier segment of the run would have.
    pub async fn prior(&self, run_id: &str, steps: &[(&str, serde_json::Value)]) {
        let run = self.store.run_get(run_id).await.unwrap();
        let epoch = run.map_or(0, |r| r.claim_epoch);
        for (kind, payload) in steps {
            let append = EventAppend {
                id: run_id.into(),
                owner: self.executor.owner().into(),
                epoch,
                kind: kind.to_string(),
                payload: payload.clone(),
                clear_fence: false,
                round: None,
                end: None,
                now_ms: 0,
            };
            assert!(self.store.run_event_append(append).await.unwrap().is_some());
        }
    }

    /// A second handle on the same database file, as another process (or node) has: its
    /// writes reach the row but publish nothing on this store's change feed.
    pub fn other_process(&self) -> SqliteStore {
        SqliteStore::open(self.dir.path().join("runwarden.db")).unwrap()
    }

    /// Status queries made so far.
    pub fn status_reads(&self) -> usize {
        self.store.status_reads.load(Ordering::SeqCst)
    }

    /// Every event kind of a run, in order.
    pub async fn kinds(&self, run_id: &str) -> Vec<String> {
        self.store
            .run_events(run_id, 0, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    /// The outcome action of every call, oldest first; each intent row is checked to be
    /// completed and left out (V7 amended).
    pub async fn audit_actions(&self) -> Vec<String> {
        let rows = self.vault.audit_list(AuditFilter::default()).await.unwrap();
        runwarden_testkit::call_outcomes(&rows)
    }
}
