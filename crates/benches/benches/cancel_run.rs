//! Measures end-to-end run cancel latency (cancel returning -> the MCP server sees the tool call's connection close; woken in-process and poll-only) and the executor's overhead per step; run: `cargo bench -p runwarden-benches --bench cancel_run [-- --json]`.
//!
//! Everything runs on 127.0.0.1: MCP servers from `runwarden-testkit` on their own
//! one-worker runtime (so the close instants they record are not queued behind the
//! client's tasks), one executor over a SQLite file in a temporary directory (runs, run
//! events and the vault's audit rows), the vault's egress with its default ticks (100 ms
//! for a signal that cannot wake, 1 s backstop for the run's signal, which wakes), and the
//! process's one status watcher (refresh every second).
//!
//! Cancel latency: a scripted agent calls a non-idempotent MCP tool that never answers;
//! once the server holds the `tools/call`, the run is cancelled. A sample is the instant
//! the server sees that connection close minus the instant the cancel returned (the row
//! update committed). "woken" cancels with `Executor::cancel` (row update + in-process
//! wake-up); "poll-only" writes the row with `RunStore::run_cancel` on a second handle of
//! the same file, as another process would (nothing reaches this process's hub or change
//! feed), so the status watcher finds it at its next periodic refresh (once per second). Poll-only trials run 100 at a time, each run on its own server
//! and cancelled at its own random offset, so 200 trials of about a second take seconds.
//! Every trial checks the outcome (cancelled), the row (cancelled, `pending_effect` kept)
//! and that the write was sent once.
//!
//! Overhead per step: sequential runs of a scripted agent (instant) calling an instant MCP
//! tool five times, then answering; each step's time comes from the executor's observer
//! (event stored -> next event stored). Baselines measured in the same loop: the bare
//! `McpClient::call_tool`, the scripted model alone, and the store operations a step makes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_mcp::{Effect, McpCall, McpClient, ServerConfig};
use runwarden_models::{Message, ModelProvider, ModelRequest, Scripted, ToolSpec};
use runwarden_runtime::store::{EventAppend, FenceMark};
use runwarden_runtime::{
    AgentSpec, BoundTool, CancelHub, Executor, ExecutorConfig, Observer, Outcome, RunEvent,
    RunState, RunStore, StatusWatcher, WatcherConfig,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Dist, HttpRequest, Seen, TestServer, mcp_handler, tool};
use runwarden_vault::{
    Algorithm, CancelFlag, EgressClient, EgressConfig, EgressPolicy, MasterKey, Vault,
};
use serde_json::{Value, json};
use tokio::runtime::Handle;
use tokio::task::JoinSet;

/// Sequential trials of the woken cancel.
const WOKEN_TRIALS: usize = 200;
/// Concurrent batches: runs in flight at once, and how many batches.
const BATCH: usize = 100;
const BATCHES: usize = 2;
/// Poll-only cancels land at a random offset in [0, 1 s) after the server holds the call,
/// i.e. at a random phase of the signal's one-read-per-second throttle.
const POLL_OFFSET: Duration = Duration::from_millis(1000);
/// Woken sequential cancels land at a random phase of the vault's 100 ms tick.
const WOKEN_OFFSET: Duration = Duration::from_millis(100);

/// Overhead: runs per agent (after warm-up), tool rounds per run.
const OVERHEAD_WARMUP: usize = 20;
const OVERHEAD_RUNS: usize = 200;
const ROUNDS: usize = 5;

const WAIT: Duration = Duration::from_secs(10);

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    // The servers' own runtime: one worker, so their timestamps do not wait on client tasks.
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-server")
        .enable_all()
        .build()
        .expect("the server runtime starts");
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the client runtime starts");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ctx = client_runtime.block_on(Ctx::open(dir.path(), server_runtime.handle().clone()));

    let started = Instant::now();
    let cancel = client_runtime.block_on(cancel_latency(&ctx));
    print_cancel(&cancel);
    let overhead = client_runtime.block_on(overhead(&ctx));
    print_overhead(&overhead);
    println!();
    println!("(took {:.1} s)", started.elapsed().as_secs_f64());

    if json {
        for figure in &cancel {
            println!("{}", figure.json());
        }
        for line in overhead.json() {
            println!("{line}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared pieces

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

use runwarden_base::now_ms;

/// xorshift64: reproducible offsets without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let nanos = bound.as_nanos() as u64;
        Duration::from_nanos(if nanos == 0 { 0 } else { self.0 % nanos })
    }
}

fn is_tools_call(request: &HttpRequest) -> bool {
    String::from_utf8_lossy(&request.body).contains("\"tools/call\"")
}

/// One executor over SQLite, a vault and an egress client admitting loopback; servers
/// start on `servers`.
#[derive(Clone)]
struct Ctx {
    executor: Arc<Executor>,
    store: Arc<dyn RunStore>,
    /// A second handle on the same file: another process's cancel.
    other: Arc<dyn RunStore>,
    egress: Arc<EgressClient>,
    servers: Handle,
}

impl Ctx {
    async fn open(dir: &Path, servers: Handle) -> Self {
        let sqlite = SqliteStore::open(dir.join("runwarden.db")).expect("the SQLite store opens");
        let other: Arc<dyn RunStore> =
            Arc::new(SqliteStore::open(dir.join("runwarden.db")).expect("a second handle opens"));
        let vault = Arc::new(
            Vault::open(
                Arc::new(sqlite.clone()),
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
        let egress = Arc::new(EgressClient::new(vault, config));
        let store: Arc<dyn RunStore> = Arc::new(sqlite);
        let watcher = StatusWatcher::new(
            store.clone(),
            Arc::new(CancelHub::new()),
            WatcherConfig::default(),
        );
        let executor = Arc::new(Executor::new(
            store.clone(),
            watcher,
            ExecutorConfig::new("bench"),
        ));
        Self {
            executor,
            store,
            other,
            egress,
            servers,
        }
    }

    /// An MCP server (tool `create`, stalling or instant) on the servers' runtime.
    async fn server(&self, stalling: bool) -> TestServer {
        let stall: &[&str] = if stalling { &["create"] } else { &[] };
        let handler = mcp_handler(vec![tool("create")], stall);
        self.servers
            .spawn(TestServer::start(handler))
            .await
            .expect("the test server starts")
    }

    fn client(&self, url: &str) -> Arc<McpClient> {
        Arc::new(McpClient::new(
            ServerConfig::new("srv", url),
            self.egress.clone(),
        ))
    }

    fn tool(&self, client: Arc<McpClient>, effect: Effect) -> BoundTool {
        BoundTool {
            spec: ToolSpec {
                name: "srv__create".into(),
                description: None,
                input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            },
            remote_name: "create".into(),
            effect,
            client,
            approval: None,
            output_schema: None,
        }
    }
}

fn agent(plan: &Value, tools: Vec<BoundTool>) -> AgentSpec {
    AgentSpec {
        name: "bench".into(),
        system: None,
        max_rounds: 20,
        provider: Arc::new(Scripted::from_json(&plan.to_string()).expect("a valid plan")),
        tools,
        max_tokens: None,
        budgets: runwarden_runtime::Budgets::default(),
        policy: None,
        tags: Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------
// 1. Cancel latency

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `Executor::cancel`: the row update, then the in-process wake-up.
    Woken,
    /// `RunStore::run_cancel` alone, as another process cancels.
    PollOnly,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Woken => "woken",
            Self::PollOnly => "poll-only",
        }
    }
}

/// What one trial saw.
#[derive(Default)]
struct Trial {
    /// Cancel returned -> the server saw the close.
    latency: Option<Duration>,
    /// Every way the trial differed from the expected end, by kind.
    problems: Vec<String>,
}

/// One run: start it, wait until the server holds its `tools/call`, wait `offset`, cancel,
/// time the close, then check the outcome and the row.
async fn cancel_trial(ctx: Ctx, mode: Mode, offset: Duration) -> Trial {
    let mut trial = Trial::default();
    let mut server = ctx.server(true).await;
    let client = ctx.client(&server.url("/mcp"));
    let plan = json!([
        {"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]},
        {"text": "never reached"}
    ]);
    let agent = agent(&plan, vec![ctx.tool(client, Effect::NonIdempotentWrite)]);
    let run = ctx
        .executor
        .create_sync("bench", "go")
        .await
        .expect("the run is created");
    let task = {
        let (executor, run) = (ctx.executor.clone(), run.clone());
        tokio::spawn(async move { executor.execute(&run, &agent, "go", None).await })
    };

    let mut tools_calls = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tools_calls == 0 {
        match tokio::time::timeout_at(deadline, server.events.recv()).await {
            Ok(Some(Seen::Request(_, request))) if is_tools_call(&request) => tools_calls += 1,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the test server stopped"),
            Err(_) => {
                trial
                    .problems
                    .push("the tools/call never reached the server".into());
                task.abort();
                return trial;
            }
        }
    }

    tokio::time::sleep(offset).await;
    let answer = match mode {
        Mode::Woken => ctx.executor.cancel(&run.id).await,
        Mode::PollOnly => ctx.other.run_cancel(&run.id, now_ms()).await,
    };
    let returned = Instant::now();
    match answer {
        Ok(runwarden_runtime::CancelAnswer::Cancelled { .. }) => {}
        other => trial.problems.push(format!("cancel answered {other:?}")),
    }

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, server.events.recv()).await {
            Ok(Some(Seen::Closed(at))) => {
                trial.latency = Some(at.saturating_duration_since(returned));
                break;
            }
            Ok(Some(Seen::Request(_, request))) if is_tools_call(&request) => tools_calls += 1,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the test server stopped"),
            Err(_) => {
                trial
                    .problems
                    .push("no close seen within 5 s of the cancel".into());
                break;
            }
        }
    }

    match tokio::time::timeout(WAIT, task).await {
        Ok(Ok(Outcome::Cancelled)) => {}
        Ok(Ok(outcome)) => trial.problems.push(format!("outcome {}", outcome.as_str())),
        Ok(Err(error)) => trial
            .problems
            .push(format!("the run's task failed: {error}")),
        Err(_) => trial
            .problems
            .push("execute did not return within 10 s".into()),
    }
    match ctx.store.run_get(&run.id).await {
        Ok(Some(row)) => {
            if row.status != RunState::Cancelled {
                trial
                    .problems
                    .push(format!("row status {}", row.status.as_str()));
            }
            if row.pending_effect.as_deref() != Some(Effect::NonIdempotentWrite.as_str()) {
                trial
                    .problems
                    .push(format!("row pending_effect {:?}", row.pending_effect));
            }
        }
        other => trial.problems.push(format!("run_get answered {other:?}")),
    }
    let stored_step = ctx
        .store
        .run_events(&run.id, 0, 0)
        .await
        .ok()
        .and_then(|events| events.into_iter().find(|e| e.kind == "effect_uncertain"));
    // R11: a write cancelled on the wire may have reached the server: its step says so.
    if stored_step.as_ref().map(|e| &e.payload["outcome"]) != Some(&json!("cancelled")) {
        trial
            .problems
            .push("the tool step was not stored as a cancelled, uncertain write".into());
    }
    // Give a retry, were there one, time to arrive; then count the writes sent.
    tokio::time::sleep(Duration::from_millis(20)).await;
    tools_calls += server
        .drain_requests()
        .iter()
        .filter(|r| is_tools_call(r))
        .count();
    if tools_calls != 1 {
        trial
            .problems
            .push(format!("the write was sent {tools_calls} times"));
    }
    trial
}

/// One mode and layout over all its trials.
struct CancelFigure {
    mode: Mode,
    /// Runs in flight at once.
    concurrent: usize,
    trials: usize,
    latency: Dist,
    /// Problems by kind (outcome, row, close, retries).
    problems: BTreeMap<String, usize>,
}

impl CancelFigure {
    fn new(mode: Mode, concurrent: usize, trials: Vec<Trial>) -> Self {
        let mut problems = BTreeMap::new();
        for trial in &trials {
            for problem in &trial.problems {
                *problems.entry(problem.clone()).or_default() += 1;
            }
        }
        let mismatched = trials.iter().filter(|t| !t.problems.is_empty()).count();
        if mismatched > 0 {
            problems.insert("(trials with any mismatch)".into(), mismatched);
        }
        Self {
            mode,
            concurrent,
            trials: trials.len(),
            latency: Dist::new(trials.iter().filter_map(|t| t.latency).collect()),
            problems,
        }
    }

    fn mismatches(&self) -> usize {
        self.problems
            .get("(trials with any mismatch)")
            .copied()
            .unwrap_or(0)
    }

    fn json(&self) -> String {
        json!({
            "bench": "run_cancel_latency",
            "mode": self.mode.name(),
            "concurrent": self.concurrent,
            "trials": self.trials,
            "samples": self.latency.len(),
            "p50_ms": ms(self.latency.pct(50.0)),
            "p99_ms": ms(self.latency.pct(99.0)),
            "max_ms": ms(self.latency.max()),
            "mismatches": self.mismatches(),
        })
        .to_string()
    }
}

async fn batch(ctx: &Ctx, mode: Mode, rng: &mut Rng, offset: Duration) -> Vec<Trial> {
    let mut set = JoinSet::new();
    for _ in 0..BATCH {
        set.spawn(cancel_trial(ctx.clone(), mode, rng.below(offset)));
    }
    let mut trials = Vec::with_capacity(BATCH);
    while let Some(trial) = set.join_next().await {
        trials.push(trial.expect("a trial panicked"));
    }
    trials
}

async fn cancel_latency(ctx: &Ctx) -> Vec<CancelFigure> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Warm-up: connection paths, the blocking pool, the tables.
    for mode in [Mode::Woken, Mode::PollOnly, Mode::Woken] {
        cancel_trial(ctx.clone(), mode, Duration::ZERO).await;
    }

    let mut woken = Vec::with_capacity(WOKEN_TRIALS);
    for _ in 0..WOKEN_TRIALS {
        let offset = rng.below(WOKEN_OFFSET);
        woken.push(cancel_trial(ctx.clone(), Mode::Woken, offset).await);
    }
    let mut poll = Vec::new();
    let mut woken_batched = Vec::new();
    for _ in 0..BATCHES {
        poll.extend(batch(ctx, Mode::PollOnly, &mut rng, POLL_OFFSET).await);
        woken_batched.extend(batch(ctx, Mode::Woken, &mut rng, POLL_OFFSET).await);
    }
    vec![
        CancelFigure::new(Mode::Woken, 1, woken),
        CancelFigure::new(Mode::Woken, BATCH, woken_batched),
        CancelFigure::new(Mode::PollOnly, BATCH, poll),
    ]
}

fn print_cancel(figures: &[CancelFigure]) {
    println!();
    println!(
        "Run cancel latency: cancel returned -> the MCP server sees the tools/call connection close (non-idempotent write, status watcher refresh 1 s, backstop tick 1 s)"
    );
    println!();
    println!(
        "(woken x1: sequential, cancel at a random 0-100 ms offset; x{BATCH}: {BATCH} runs in flight, each cancelled at its own random 0-1000 ms offset)"
    );
    println!();
    println!("| mode      | in flight | trials | p50 ms | p99 ms | max ms | mismatches |");
    println!("| --------- | --------: | -----: | -----: | -----: | -----: | ---------: |");
    for f in figures {
        println!(
            "| {:<9} | {:>9} | {:>6} | {:>6.2} | {:>6.2} | {:>6.2} | {:>10} |",
            f.mode.name(),
            f.concurrent,
            f.trials,
            ms(f.latency.pct(50.0)),
            ms(f.latency.pct(99.0)),
            ms(f.latency.max()),
            f.mismatches(),
        );
    }
    for f in figures {
        for (kind, count) in &f.problems {
            println!("  ! {} x{}: {count} x {kind}", f.mode.name(), f.concurrent);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. Executor overhead per step

#[derive(Clone, Copy, PartialEq, Eq)]
enum Figure {
    ModelStepWrite,
    ToolStepWrite,
    ModelStepRead,
    ToolStepRead,
    BareMcp,
    BareModel,
    RowRead,
    EventAppend,
    FenceMark,
    RunWrite,
}

const FIGURES: [Figure; 10] = [
    Figure::ModelStepWrite,
    Figure::ToolStepWrite,
    Figure::ModelStepRead,
    Figure::ToolStepRead,
    Figure::BareMcp,
    Figure::BareModel,
    Figure::RowRead,
    Figure::EventAppend,
    Figure::FenceMark,
    Figure::RunWrite,
];

impl Figure {
    fn label(self) -> &'static str {
        match self {
            Self::ModelStepWrite => "model step (executor, scripted model)",
            Self::ToolStepWrite => "tool step (executor, non-idempotent write tool)",
            Self::ModelStepRead => "model step (executor, read-only agent)",
            Self::ToolStepRead => "tool step (executor, read-only tool)",
            Self::BareMcp => "bare McpClient::call_tool + CancelFlag",
            Self::BareModel => "bare Scripted::complete, no signal",
            Self::RowRead => "store: run_statuses (one run, the R5 probe)",
            Self::EventAppend => "store: run_event_append (one step record)",
            Self::FenceMark => "store: run_fence_mark (one fence stamp)",
            Self::RunWrite => "whole run, write tool (6 model + 5 tool steps)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::ModelStepWrite => "model_step_write_agent",
            Self::ToolStepWrite => "tool_step_write",
            Self::ModelStepRead => "model_step_read_agent",
            Self::ToolStepRead => "tool_step_read_only",
            Self::BareMcp => "bare_mcp_call_tool",
            Self::BareModel => "bare_scripted_complete",
            Self::RowRead => "store_run_statuses_one",
            Self::EventAppend => "store_run_event_append",
            Self::FenceMark => "store_run_fence_mark",
            Self::RunWrite => "run_total_write",
        }
    }
}

struct Overhead {
    dists: Vec<(Figure, Dist)>,
    runs: usize,
    not_completed: BTreeMap<String, usize>,
}

impl Overhead {
    fn get(&self, figure: Figure) -> &Dist {
        &self
            .dists
            .iter()
            .find(|(f, _)| *f == figure)
            .expect("every figure is measured")
            .1
    }

    fn json(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .dists
            .iter()
            .map(|(f, d)| {
                json!({
                    "bench": "executor_step_overhead",
                    "figure": f.key(),
                    "samples": d.len(),
                    "mean_us": us(d.mean()),
                    "p50_us": us(d.pct(50.0)),
                    "p99_us": us(d.pct(99.0)),
                    "max_us": us(d.max()),
                })
                .to_string()
            })
            .collect();
        let p50 = |f: Figure| us(self.get(f).pct(50.0));
        let mean = |f: Figure| us(self.get(f).mean());
        lines.push(
            json!({
                "bench": "executor_step_overhead_vs_bare",
                "runs_per_agent": self.runs,
                "tool_step_write_minus_bare_mcp_p50_us": p50(Figure::ToolStepWrite) - p50(Figure::BareMcp),
                "tool_step_write_minus_bare_mcp_mean_us": mean(Figure::ToolStepWrite) - mean(Figure::BareMcp),
                "tool_step_read_minus_bare_mcp_p50_us": p50(Figure::ToolStepRead) - p50(Figure::BareMcp),
                "model_step_minus_bare_model_p50_us": p50(Figure::ModelStepWrite) - p50(Figure::BareModel),
                "not_completed": self.not_completed.values().sum::<usize>(),
            })
            .to_string(),
        );
        lines
    }
}

/// Runs the agent once, timing each step from the previous event's record to its own.
async fn timed_run(
    ctx: &Ctx,
    agent: &AgentSpec,
    model_steps: &mut Vec<Duration>,
    tool_steps: &mut Vec<Duration>,
    not_completed: &mut BTreeMap<String, usize>,
) -> Duration {
    let seen: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let observer: Observer = {
        let seen = seen.clone();
        Arc::new(move |event: &RunEvent| {
            let at = Instant::now();
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((event.kind.clone(), at));
        })
    };
    let started = Instant::now();
    let run = ctx
        .executor
        .create_sync("bench", "go")
        .await
        .expect("the run is created");
    let outcome = ctx
        .executor
        .execute(&run, agent, "go", Some(observer))
        .await;
    let took = started.elapsed();
    if outcome != Outcome::Completed {
        *not_completed
            .entry(format!("outcome {}", outcome.as_str()))
            .or_default() += 1;
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()));
    for pair in seen.windows(2) {
        let step = pair[1].1.saturating_duration_since(pair[0].1);
        match pair[1].0.as_str() {
            "model_response" => model_steps.push(step),
            "tool_executed" => tool_steps.push(step),
            _ => {}
        }
    }
    let tools_ok = seen.iter().filter(|(k, _)| k == "tool_executed").count();
    if tools_ok != ROUNDS {
        *not_completed
            .entry(format!("{tools_ok} tool steps instead of {ROUNDS}"))
            .or_default() += 1;
    }
    took
}

async fn overhead(ctx: &Ctx) -> Overhead {
    let server = ctx.server(false).await;
    let url = server.url("/mcp");
    let mut plan: Vec<Value> = (0..ROUNDS)
        .map(|_| json!({"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]}))
        .collect();
    plan.push(json!({"text": "done"}));
    let plan = Value::Array(plan);
    // One McpClient per agent, as the runtime binds one per server and reuses its session.
    let write_agent = agent(
        &plan,
        vec![ctx.tool(ctx.client(&url), Effect::NonIdempotentWrite)],
    );
    let read_agent = agent(&plan, vec![ctx.tool(ctx.client(&url), Effect::ReadOnly)]);
    let bare = ctx.client(&url);
    let flag = CancelFlag::new();
    let model = Scripted::from_json(&plan.to_string()).expect("a valid plan");
    let model_request = ModelRequest {
        system: None,
        messages: vec![Message::User { text: "go".into() }],
        tools: write_agent.tools.iter().map(|t| t.spec.clone()).collect(),
        correlation: Some("bench".into()),
        progress: None,
        max_tokens: None,
    };
    // A live run of this executor for the store's own operations.
    let probe_run = ctx
        .executor
        .create_sync("bench", "go")
        .await
        .expect("the run is created");
    let owner = ctx.executor.owner().to_string();

    let mut samples: Vec<Vec<Duration>> = FIGURES.iter().map(|_| Vec::new()).collect();
    let slot = |f: Figure| FIGURES.iter().position(|g| *g == f).expect("listed");
    let mut not_completed = BTreeMap::new();
    for i in 0..OVERHEAD_WARMUP + OVERHEAD_RUNS {
        let keep = i >= OVERHEAD_WARMUP;
        let (mut model_w, mut tool_w, mut model_r, mut tool_r) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut nc = BTreeMap::new();
        // Alternate which agent runs first so drift hits both alike.
        let total_w = if i % 2 == 0 {
            let t = timed_run(ctx, &write_agent, &mut model_w, &mut tool_w, &mut nc).await;
            timed_run(ctx, &read_agent, &mut model_r, &mut tool_r, &mut nc).await;
            t
        } else {
            timed_run(ctx, &read_agent, &mut model_r, &mut tool_r, &mut nc).await;
            timed_run(ctx, &write_agent, &mut model_w, &mut tool_w, &mut nc).await
        };
        let mut bare_mcp = Vec::new();
        let mut bare_model = Vec::new();
        let mut row_read = Vec::new();
        let mut append = Vec::new();
        let mut fence = Vec::new();
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let call = McpCall {
                tool: "create".into(),
                arguments: json!({"q": "printer"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                correlation: Some("bench".into()),
                gate: None,
                elicitor: None,
                output_schema: None,
                notices: None,
                ..Default::default()
            };
            let result = bare.call_tool(call, Some(&flag)).await.result;
            bare_mcp.push(started.elapsed());
            if !result.is_success() {
                *nc.entry("bare tools/call failed".to_string()).or_default() += 1;
            }

            let started = Instant::now();
            let turn = model.complete(&model_request, None).await;
            bare_model.push(started.elapsed());
            assert!(turn.is_ok(), "the scripted model answers");

            let started = Instant::now();
            let status = ctx
                .store
                .run_statuses(std::slice::from_ref(&probe_run.id))
                .await;
            row_read.push(started.elapsed());
            assert_eq!(
                status.ok().and_then(|rows| rows.first().map(|(_, s)| *s)),
                Some(RunState::Running)
            );

            let now = now_ms();
            let mark = FenceMark {
                id: probe_run.id.clone(),
                owner: owner.clone(),
                epoch: probe_run.claim_epoch,
                effect: Effect::NonIdempotentWrite.as_str().into(),
                lease_until_ms: now + 30_000,
                now_ms: now,
            };
            let started = Instant::now();
            let marked = ctx.store.run_fence_mark(mark).await;
            fence.push(started.elapsed());
            assert!(matches!(marked, Ok(true)), "the fence is stamped");

            let event = EventAppend {
                id: probe_run.id.clone(),
                owner: owner.clone(),
                epoch: probe_run.claim_epoch,
                kind: "tool_executed".into(),
                payload: json!({"round": 1, "tool": "srv__create", "outcome": "succeeded", "text": "create {\"q\":\"printer\"}"}),
                clear_fence: true,
                round: None,
                end: None,
                now_ms: now_ms(),
                before: None,
            };
            let started = Instant::now();
            let appended = ctx.store.run_event_append(event).await;
            append.push(started.elapsed());
            assert!(matches!(appended, Ok(Some(_))), "the event is stored");
        }
        if keep {
            samples[slot(Figure::ModelStepWrite)].extend(model_w);
            samples[slot(Figure::ToolStepWrite)].extend(tool_w);
            samples[slot(Figure::ModelStepRead)].extend(model_r);
            samples[slot(Figure::ToolStepRead)].extend(tool_r);
            samples[slot(Figure::BareMcp)].extend(bare_mcp);
            samples[slot(Figure::BareModel)].extend(bare_model);
            samples[slot(Figure::RowRead)].extend(row_read);
            samples[slot(Figure::EventAppend)].extend(append);
            samples[slot(Figure::FenceMark)].extend(fence);
            samples[slot(Figure::RunWrite)].push(total_w);
            for (kind, count) in nc {
                *not_completed.entry(kind).or_default() += count;
            }
        }
    }
    drop(server);

    Overhead {
        dists: FIGURES
            .iter()
            .copied()
            .zip(samples.into_iter().map(Dist::new))
            .collect(),
        runs: OVERHEAD_RUNS,
        not_completed,
    }
}

fn print_overhead(o: &Overhead) {
    println!();
    println!(
        "Executor overhead per step: {} sequential runs per agent after {} warm-up, {} tool rounds + a final answer each; baselines interleaved",
        o.runs, OVERHEAD_WARMUP, ROUNDS
    );
    println!();
    println!(
        "| figure                                          | samples | mean us | p50 us | p99 us | max us |"
    );
    println!(
        "| ----------------------------------------------- | ------: | ------: | -----: | -----: | -----: |"
    );
    for (figure, d) in &o.dists {
        println!(
            "| {:<47} | {:>7} | {:>7.0} | {:>6.0} | {:>6.0} | {:>6.0} |",
            figure.label(),
            d.len(),
            us(d.mean()),
            us(d.pct(50.0)),
            us(d.pct(99.0)),
            us(d.max()),
        );
    }
    let p50 = |f: Figure| us(o.get(f).pct(50.0));
    let mean = |f: Figure| us(o.get(f).mean());
    println!();
    println!(
        "tool step (write) over bare McpClient: {:+.0} us at p50, {:+.0} us mean; read-only tool step: {:+.0} us at p50",
        p50(Figure::ToolStepWrite) - p50(Figure::BareMcp),
        mean(Figure::ToolStepWrite) - mean(Figure::BareMcp),
        p50(Figure::ToolStepRead) - p50(Figure::BareMcp),
    );
    println!(
        "model step over bare scripted model: {:+.0} us at p50, {:+.0} us mean",
        p50(Figure::ModelStepWrite) - p50(Figure::BareModel),
        mean(Figure::ModelStepWrite) - mean(Figure::BareModel),
    );
    for (kind, count) in &o.not_completed {
        println!("  ! {count} x {kind}");
    }
}
