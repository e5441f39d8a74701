//! What limits (R14) cost on SQLite, in one run:
//!
//! - `tools/call` throughput through `McpClient` (vault, audit rows synced to disk) with
//!   64 concurrent callers, with no limit, under a concurrency limit that never fills
//!   (a take and a release per call: two write transactions), and under a rate limit that
//!   never runs dry (a take: one write transaction). The runs take turns, twice each, so a
//!   burst of load on the shared machine lands on all of them alike.
//! - The same calls with 100 Cedar policies decided before each (allowed: the executor
//!   then writes nothing more), alone and with the rate limit: what policy and limits on
//!   every call cost side by side with them off.
//! - A limit check alone: checks per second from 64 concurrent callers, and sequential
//!   p50 and p99 (the take and release of a concurrency limit, the take of a rate limit).
//! - How fast a cancel ends a call's wait for a full limit (the signal woken in-process),
//!   p50 and p99.
//!
//! Run: `cargo bench -p runwarden-benches --bench limits`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_mcp::{McpCall, McpClient, ServerConfig};
use runwarden_policy::{Decision, Policies, PolicyFile, Request, RunFacts, Target};
use runwarden_runtime::limits::{
    Limit, LimitKey, LimitKind, LimitObserver, LimitPlan, LimitStop, LimitStore, LimitTake,
    Limiter, Limits, TakeAttempt, WaitEnd,
};
use runwarden_runtime::rules::limits::LimitRule;
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Dist, LoopbackVault, TestServer, loopback_vault, mcp_handler, tool};
use runwarden_vault::CancelFlag;
use serde_json::json;

const CONCURRENT: usize = 64;
const CONCURRENT_CALLS: usize = 4_000;
const CHECKS: usize = 2_000;
const CANCELS: usize = 200;

fn limiter(store: &Arc<SqliteStore>, rule: LimitRule) -> Arc<Limiter> {
    let mut limits = Limits::default();
    limits.limits.insert(
        LimitKey::new(LimitKind::Server, "bench"),
        Limit {
            rule,
            max_wait: Duration::from_secs(30),
        },
    );
    let store: Arc<dyn LimitStore> = store.clone();
    Arc::new(Limiter::new(limits, store))
}

/// A concurrency limit far above the callers: it never fills.
const WIDE: LimitRule = LimitRule {
    concurrency: Some(1_000_000),
    rate_per_second: None,
    burst: 1,
};

/// A rate far above what the machine does: its bucket never runs dry.
const FAST: LimitRule = LimitRule {
    concurrency: None,
    rate_per_second: Some(1e9),
    burst: 1_000_000,
};

/// 100 policies of the kinds operators write, over 50 tools: per tool a permit with a rule
/// on an argument and a forbid on a path prefix; the asked tool (`bench__echo`) is allowed.
fn policies() -> Arc<Policies> {
    let mut text = String::new();
    for i in 0..50 {
        let tool = if i == 0 {
            "bench__echo".to_string()
        } else {
            format!("srv{i}__tool")
        };
        text.push_str(&format!(
            "@id(\"permit{i}\")\npermit (principal, action == Action::\"call_tool\", resource == Tool::\"{tool}\")\nwhen {{ context.arguments has text }};\n\
             @id(\"forbid{i}\")\nforbid (principal, action == Action::\"call_tool\", resource == Tool::\"{tool}\")\nwhen {{ context.arguments has path && !(context.arguments.path like \"/srv/*\") }};\n"
        ));
    }
    let file = PolicyFile {
        name: "bench.cedar".into(),
        text,
    };
    Arc::new(Policies::from_files(&[file]).expect("the bench's policies validate"))
}

/// Decides one call as the executor does (the request built from the call), and checks
/// that it is allowed.
fn decide(policies: &Policies, call: &McpCall) {
    let request = Request {
        agent: "agent".into(),
        agent_tags: Vec::new(),
        token: None,
        target: Target::Tool {
            id: "bench__echo".into(),
            server: "bench".into(),
            name: call.tool.clone(),
            effect: "read_only".into(),
        },
        arguments: call.arguments.clone(),
        run: RunFacts::default(),
        host: "127.0.0.1".into(),
    };
    assert_eq!(policies.decide(&request).decision, Decision::Allow);
}

/// Says when a wait begins.
struct Began(tokio::sync::mpsc::UnboundedSender<()>);

impl LimitObserver for Began {
    fn wait_began(&self) {
        let _ = self.0.send(());
    }
    fn wait_ended(&self, _: WaitEnd, _: Duration) {}
}

/// Calls per second of `CONCURRENT_CALLS` calls from `CONCURRENT` tasks.
async fn throughput<F, Fut>(call: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..CONCURRENT {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            for _ in (worker..CONCURRENT_CALLS).step_by(CONCURRENT) {
                call().await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    CONCURRENT_CALLS as f64 / started.elapsed().as_secs_f64()
}

async fn taken(limiter: &Limiter, plan: &LimitPlan) -> runwarden_runtime::limits::Hold {
    match limiter.try_take(plan).await {
        Ok(TakeAttempt::Taken(hold)) => hold,
        other => panic!("the limit never fills: {other:?}"),
    }
}

fn line(name: &str, samples: Vec<Duration>) {
    let dist = Dist::new(samples);
    println!(
        "{name:<44} p50 {:>9.3?}  p99 {:>9.3?}",
        dist.pct(50.0),
        dist.pct(99.0)
    );
}

#[tokio::main]
async fn main() {
    let server = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let LoopbackVault { dir, egress, .. } = loopback_vault().await;
    let store = Arc::new(SqliteStore::open(dir.path().join("runwarden.db")).unwrap());
    let client = Arc::new(McpClient::new(
        ServerConfig::new("bench", server.url("/mcp")),
        egress,
    ));
    let call = || McpCall {
        tool: "echo".into(),
        arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
        ..Default::default()
    };
    for _ in 0..200 {
        assert!(client.call_tool(call(), None).await.result.is_success());
    }

    let (mut off, mut slots, mut rate) = (Vec::new(), Vec::new(), Vec::new());
    let (mut decided, mut both) = (Vec::new(), Vec::new());
    let set = policies();
    for _ in 0..2 {
        let c = client.clone();
        off.push(
            throughput(move || {
                let c = c.clone();
                async move { assert!(c.call_tool(call(), None).await.result.is_success()) }
            })
            .await,
        );
        for (rule, figures) in [(WIDE, &mut slots), (FAST, &mut rate)] {
            let (c, l) = (client.clone(), limiter(&store, rule));
            let plan = l.for_tool("agent", None, "bench", "bench__echo");
            figures.push(
                throughput(move || {
                    let (c, l, plan) = (c.clone(), l.clone(), plan.clone());
                    async move {
                        let hold = taken(&l, &plan).await;
                        assert!(c.call_tool(call(), None).await.result.is_success());
                        hold.release().await;
                    }
                })
                .await,
            );
        }
        let (c, p) = (client.clone(), set.clone());
        decided.push(
            throughput(move || {
                let (c, p) = (c.clone(), p.clone());
                async move {
                    let call = call();
                    decide(&p, &call);
                    assert!(c.call_tool(call, None).await.result.is_success());
                }
            })
            .await,
        );
        let (c, p, l) = (client.clone(), set.clone(), limiter(&store, FAST));
        let plan = l.for_tool("agent", None, "bench", "bench__echo");
        both.push(
            throughput(move || {
                let (c, p, l, plan) = (c.clone(), p.clone(), l.clone(), plan.clone());
                async move {
                    let call = call();
                    decide(&p, &call);
                    let hold = taken(&l, &plan).await;
                    assert!(c.call_tool(call, None).await.result.is_success());
                    hold.release().await;
                }
            })
            .await,
        );
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!("tools/call, {CONCURRENT} concurrent callers, {CONCURRENT_CALLS} calls, best of 2:");
    let base = best(&off);
    for (name, figures) in [
        ("no limit", &off),
        ("a concurrency limit that never fills", &slots),
        ("a rate limit that never runs dry", &rate),
        ("100 policies decided (allowed)", &decided),
        ("100 policies and the rate limit", &both),
    ] {
        let b = best(figures);
        println!(
            "  {name:<42} {b:>8.0} calls/s  ({:.2}x of no limit; runs {figures:.0?})",
            b / base
        );
    }

    println!("limit checks alone (no call), {CONCURRENT} concurrent callers:");
    for (name, rule) in [
        ("concurrency: take and release", WIDE),
        ("rate: take", FAST),
    ] {
        let l = limiter(&store, rule);
        let plan = l.for_tool("agent", None, "bench", "bench__echo");
        let per_second = throughput(move || {
            let (l, plan) = (l.clone(), plan.clone());
            async move { taken(&l, &plan).await.release().await }
        })
        .await;
        println!("  {name:<42} {per_second:>8.0} checks/s");
    }

    println!("one limit check on SQLite, sequential, {CHECKS} checks:");
    for (name, rule) in [
        ("  concurrency: take and release", WIDE),
        ("  rate: take", FAST),
    ] {
        let l = limiter(&store, rule);
        let plan = l.for_tool("agent", None, "bench", "bench__echo");
        let mut samples = Vec::with_capacity(CHECKS);
        for _ in 0..CHECKS {
            let started = Instant::now();
            taken(&l, &plan).await.release().await;
            samples.push(started.elapsed());
        }
        line(name, samples);
    }

    // A full limit: another holder keeps the only slot.
    let one = LimitRule {
        concurrency: Some(1),
        rate_per_second: None,
        burst: 1,
    };
    let now = runwarden_base::now_ms();
    store
        .limit_take(LimitTake {
            holder: "elsewhere".into(),
            limits: vec![("server:bench".into(), one)],
            now_ms: now,
            hold_until_ms: now + 3_600_000,
        })
        .await
        .unwrap();
    // Told when a wait begins, so the cancel is sent to a waiting call, never guessed.
    let (began, mut waiting) = tokio::sync::mpsc::unbounded_channel();
    let mut limits = Limits::default();
    limits.limits.insert(
        LimitKey::new(LimitKind::Server, "bench"),
        Limit {
            rule: one,
            max_wait: Duration::from_secs(30),
        },
    );
    let l = Arc::new(Limiter::new(limits, store.clone()).with_observer(Arc::new(Began(began))));
    let plan = l.for_tool("agent", None, "bench", "bench__echo");
    let mut samples = Vec::with_capacity(CANCELS);
    for _ in 0..CANCELS {
        let TakeAttempt::Full(full) = l.try_take(&plan).await.unwrap() else {
            panic!("the limit is full");
        };
        let flag = CancelFlag::new();
        let (waiter, signal) = (l.clone(), flag.clone());
        let plan = plan.clone();
        let wait = tokio::spawn(async move { waiter.wait(&plan, full, &signal).await });
        waiting.recv().await.expect("the wait began");
        let started = Instant::now();
        flag.cancel();
        let stopped = wait.await.unwrap();
        samples.push(started.elapsed());
        assert!(matches!(stopped, Err(LimitStop::Cancelled(_))));
    }
    line("a cancel ending a wait for a full limit", samples);
}
