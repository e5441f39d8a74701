//! Fixtures for the runtime tests: a real SQLite store behind a thin wrapper that counts
//! (and, when told, fails or holds) status reads and step records; a vault; MCP servers on
//! 127.0.0.1.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use runwarden_mcp::{Effect, McpClient, ServerConfig};
use runwarden_models::{ModelProvider, ModelTurn, Scripted, ToolSpec};
use runwarden_runtime::store::EventAppend;
use runwarden_runtime::{
    AgentSpec, BoundTool, CancelHub, Executor, ExecutorConfig, RunStore, StatusWatcher,
    WatcherConfig,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Call, Detail, Hook, HookedStore, StoreAnswer, Strike};
use runwarden_vault::store::{AuditFilter, StoreError};
use runwarden_vault::{EgressClient, Vault};
use serde_json::json;

pub const WAIT: Duration = Duration::from_secs(10);

/// The real store behind [`Instrumented`].
pub type InstrumentedStore = HookedStore<SqliteStore, Instrumented>;

/// What the tests do around the real store's calls: count status reads (each one batched
/// query), fail them or tool-step records on demand, hold answers, hang renewals.
#[derive(Default)]
pub struct Instrumented {
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
    /// How many runs each `run_claim_many` answered, in order.
    pub claimed_at_once: std::sync::Mutex<Vec<usize>>,
    /// Gets a permit each time the run counts are folded.
    pub folds: tokio::sync::Notify,
}

#[async_trait]
impl Hook for Instrumented {
    async fn before(&self, call: &Call) -> Strike {
        match (call.method, &call.detail) {
            ("run_statuses", Detail::Ids(ids)) => {
                self.status_reads.fetch_add(1, Ordering::SeqCst);
                self.largest_read.fetch_max(*ids, Ordering::SeqCst);
                self.read_started.notify_waiters();
                if self.fail_probes.load(Ordering::SeqCst) {
                    return Strike::Fail(StoreError::new(
                        "reading a run's status",
                        "injected failure",
                    ));
                }
            }
            ("run_counts_fold", _) => self.folds.notify_one(),
            ("run_heartbeat", _) if self.hang_heartbeats.load(Ordering::SeqCst) => {
                return Strike::Hang;
            }
            ("run_event_append", Detail::EventKind(kind)) => {
                let failing_kind = self.fail_kinds.lock().unwrap().contains(kind);
                if failing_kind
                    || kind == "tool_executed" && self.fail_tool_steps.load(Ordering::SeqCst)
                {
                    return Strike::Fail(StoreError::new(
                        "appending a run event",
                        "injected failure: the disk is full",
                    ));
                }
            }
            _ => {}
        }
        Strike::Pass
    }

    async fn after(&self, call: &Call, answer: StoreAnswer<'_>) -> Option<StoreError> {
        if call.method == "run_claim_many"
            && let Some(Ok(claimed)) = answer
                .result
                .downcast_ref::<Result<Vec<runwarden_runtime::queue::Claimed>, StoreError>>()
        {
            self.claimed_at_once.lock().unwrap().push(claimed.len());
        }
        if call.method == "run_statuses" {
            self.read_done.notify_one();
            drop(self.hold_answers.lock().await);
        }
        None
    }
}

/// A vault, an egress client admitting loopback, an instrumented store and an executor.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub store: Arc<InstrumentedStore>,
    pub vault: Arc<Vault>,
    pub egress: Arc<EgressClient>,
    pub hub: Arc<CancelHub>,
    pub watcher: StatusWatcher,
    pub executor: Arc<Executor>,
}

/// A model's final answer: `text`, no tool calls.
pub fn final_turn(text: &str) -> ModelTurn {
    ModelTurn {
        text: Some(text.into()),
        tool_calls: vec![],
        finish: None,
        usage: None,
    }
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
    let store = Arc::new(HookedStore::new(Arc::new(inner), Instrumented::default()));
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
            policy: None,
            tags: Vec::new(),
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
                before: None,
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
