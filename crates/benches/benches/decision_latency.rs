//! Measures R12's answer-to-call latency: from an operator's answer committing (what the
//! API's 200 follows) to the approved `tools/call` reaching the MCP server; run:
//! `cargo bench -p runwarden-benches --bench decision_latency`.
//!
//! Each trial enqueues a run whose one tool needs an approval; a worker (in this process)
//! claims it and the run parks; the bench answers `approve` with `decide` and notes the
//! instant it returned; the sample ends when the server (on its own one-worker runtime)
//! holds the `tools/call`. The worker learns of the answer the way it would in production:
//! - same process, SQLite: the answer goes through the worker's own store handle, whose
//!   change feed wakes the worker (`Ready`);
//! - another process, SQLite: the answer goes through a second handle on the same file, as
//!   `runwarden approve` or another `serve` would; the worker's store hears of it from its
//!   250 ms other-writers look (`Resync`), or its 1 s claim backstop;
//! - another node, PostgreSQL (with `RUNWARDEN_TEST_PG_URL`, or a throwaway cluster when
//!   `RUNWARDEN_BENCH_PG=1`): a second pool answers and NOTIFY wakes the worker's node.
//!
//! Every trial checks the run completed and the server got the call exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use runwarden_benches as _;
use runwarden_mcp::{Effect, McpClient, ServerConfig};
use runwarden_models::{Scripted, ToolSpec};
use runwarden_runtime::queue::QueueStore;
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{
    AgentError, AgentSource, AgentSpec, Answer, AnswerRequest, BoundTool, CancelHub, Change,
    DecisionFilter, DecisionStatus, Executor, ExecutorConfig, RunState, RunStore, StatusWatcher,
    StopLevel, WatcherConfig, Worker, WorkerConfig, decide,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Dist, Seen, TestServer, mcp_handler, tool};
use runwarden_vault::{Algorithm, EgressClient, EgressConfig, EgressPolicy, MasterKey, Vault};
use serde_json::json;
use tokio::runtime::Handle;

const TRIALS: usize = 100;
const WAIT: Duration = Duration::from_secs(10);

use runwarden_base::now_ms;

/// The one agent: asks for `srv__create`, which needs an approval, then answers.
struct Agents {
    client: Arc<McpClient>,
}

#[async_trait]
impl AgentSource for Agents {
    async fn agent(&self, _name: &str) -> Result<AgentSpec, AgentError> {
        let plan = json!([
            {"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]},
            {"text": "done"}
        ]);
        Ok(AgentSpec {
            name: "helper".into(),
            system: None,
            max_rounds: 5,
            provider: Arc::new(Scripted::from_json(&plan.to_string()).expect("a plan")),
            tools: vec![BoundTool {
                spec: ToolSpec {
                    name: "srv__create".into(),
                    description: None,
                    input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
                },
                remote_name: "create".into(),
                effect: Effect::NonIdempotentWrite,
                client: self.client.clone(),
                approval: Some(Duration::from_secs(3600)),
                output_schema: None,
            }],
            max_tokens: None,
            budgets: Default::default(),
            policy: None,
            tags: Vec::new(),
        })
    }
}

async fn egress(dir: &std::path::Path) -> Arc<EgressClient> {
    let vault_store = SqliteStore::open(dir.join("vault.db")).expect("the vault's store opens");
    let vault = Arc::new(
        Vault::open(
            Arc::new(vault_store),
            MasterKey::generate(),
            Algorithm::default(),
        )
        .await
        .expect("the vault opens"),
    );
    let config = EgressConfig {
        policy: EgressPolicy::new(&["127.0.0.1"]).expect("a loopback policy"),
        ..EgressConfig::default()
    };
    Arc::new(EgressClient::new(vault, config))
}

/// One mode: a worker on `worker_store`, answers through `answer_store`.
async fn mode(
    worker_store: Arc<dyn QueueStore>,
    answer_store: Arc<dyn RunStore>,
    egress: Arc<EgressClient>,
    servers: &Handle,
) -> Dist {
    let mut server = servers
        .spawn(TestServer::start(mcp_handler(vec![tool("create")], &[])))
        .await
        .expect("the server starts");
    let client = Arc::new(McpClient::new(
        ServerConfig::new("srv", server.url("/mcp")),
        egress,
    ));
    let watcher = StatusWatcher::new(
        worker_store.clone(),
        Arc::new(CancelHub::new()),
        WatcherConfig::default(),
    );
    let executor = Arc::new(Executor::with_queue(
        worker_store.clone(),
        watcher,
        ExecutorConfig::new("bench-worker"),
    ));
    let worker = Arc::new(Worker::new(
        executor,
        worker_store.clone(),
        Arc::new(Agents { client }),
        WorkerConfig {
            concurrency: 4,
            ..WorkerConfig::default()
        },
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
    let running = tokio::spawn(worker.run(stop_rx));
    let mut samples = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let mut feed = worker_store.change_feed().subscribe();
        let id = uuid::Uuid::now_v7().to_string();
        worker_store
            .run_create(RunCreate {
                id: id.clone(),
                agent: "helper".into(),
                correlation: id.clone(),
                request: Some(json!({"prompt": "go"})),
                status: NewRunStatus::Queued,
                now_ms: now_ms(),
                origin: Default::default(),
            })
            .await
            .expect("enqueue");
        // Wait for the park on the worker's own feed (its own commit).
        let parked = async {
            loop {
                match feed.recv().await {
                    Ok(Change::Status { run_id, status })
                        if run_id == id && status == RunState::WaitingForApproval =>
                    {
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => panic!("the feed failed: {e}"),
                }
            }
        };
        tokio::time::timeout(WAIT, parked)
            .await
            .expect("the run parked");
        let decision = answer_store
            .decision_list(DecisionFilter {
                run_id: Some(id.clone()),
                status: Some(DecisionStatus::Pending),
                ..DecisionFilter::default()
            })
            .await
            .expect("list")
            .pop()
            .expect("a pending decision");
        let request = AnswerRequest {
            answer: Some(Answer::Approve),
            ..AnswerRequest::default()
        };
        decide(&*answer_store, &decision, request, "bench", None, now_ms())
            .await
            .expect("the approval is taken");
        let answered = Instant::now();
        let arrived = loop {
            match server.next(WAIT).await {
                Seen::Request(at, request)
                    if String::from_utf8_lossy(&request.body).contains("\"tools/call\"") =>
                {
                    break at;
                }
                _ => {}
            }
        };
        samples.push(arrived.saturating_duration_since(answered));
        // The run completes before the next trial, and the call was made once.
        let done = async {
            loop {
                let run = worker_store.run_get(&id).await.expect("run").expect("run");
                if run.status == RunState::Completed {
                    return;
                }
                let _ = feed.recv().await;
            }
        };
        tokio::time::timeout(WAIT, done)
            .await
            .expect("the run completed");
    }
    let calls = server
        .drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count();
    assert_eq!(calls, 0, "no call beyond one per trial");
    let _ = stop_tx.send(StopLevel::Now);
    let _ = running.await;
    Dist::new(samples)
}

fn print(name: &str, dist: &Dist) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<40} n={:<4} p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
        dist.len(),
        ms(dist.pct(50.0)),
        ms(dist.pct(99.0)),
        ms(dist.max())
    );
}

fn main() {
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the server runtime");
    let client = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the client runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    client.block_on(async {
        let egress = egress(dir.path()).await;
        println!(
            "answer committed -> approved tools/call at the MCP server ({TRIALS} trials each)"
        );

        let db = dir.path().join("same.db");
        let store = SqliteStore::open(&db).expect("opens");
        let queue: Arc<dyn QueueStore> = Arc::new(store.clone());
        let runs: Arc<dyn RunStore> = Arc::new(store);
        let same = mode(queue, runs, egress.clone(), servers.handle()).await;
        print("same process, SQLite", &same);

        let db = dir.path().join("other.db");
        let store = SqliteStore::open(&db).expect("opens");
        let _looking = Arc::new(store.clone())
            .watch_other_writers(Duration::from_millis(250))
            .await;
        let other: Arc<dyn RunStore> = Arc::new(SqliteStore::open(&db).expect("a second handle"));
        let across = mode(Arc::new(store), other, egress.clone(), servers.handle()).await;
        print("another process, SQLite (250 ms look)", &across);

        let pg_url = std::env::var("RUNWARDEN_TEST_PG_URL").ok();
        if pg_url.is_some() || std::env::var("RUNWARDEN_BENCH_PG").is_ok() {
            let cluster = runwarden_testkit::TempCluster::start();
            let url = cluster.fresh_database().await;
            let node_a = runwarden_store_postgres::PgStore::connect(&url)
                .await
                .expect("node A connects");
            let node_b = runwarden_store_postgres::PgStore::connect(&url)
                .await
                .expect("node B connects");
            let nodes = mode(Arc::new(node_a), Arc::new(node_b), egress, servers.handle()).await;
            print("another node, PostgreSQL (NOTIFY)", &nodes);
        } else {
            println!("(PostgreSQL skipped: set RUNWARDEN_TEST_PG_URL or RUNWARDEN_BENCH_PG=1)");
        }
    });
}
