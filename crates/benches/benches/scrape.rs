//! What a metrics scrape costs the calls beside it when the audit log is large. `GET
//! /metrics` counts the audit rows by action and the runs by state at every scrape; a
//! deployment that has run for months holds millions of audit rows (two per call).
//!
//! The bench fills a fresh store's audit log with `--rows` rows (2,000,000 by default;
//! written straight into the table with ids below zero, so the chain the calls extend
//! stays its own), then makes `--calls` sequential `tools/call`s through `McpClient`
//! (vault, intent synced, audit rows) to a local server. Blocks of calls alone take turns
//! with blocks made while a scraper counts, as `/metrics` does, every `--every-ms`
//! milliseconds (250 by default; Prometheus scrapes every 15 to 60 s, so this packs many
//! scrapes into a short run). A scrape folds the audit rows appended since the last one
//! into the counts the store keeps beside the log and reads them, and counts the runs by
//! state. It prints the calls' latency in each part and how long the scrapes took, the
//! first one apart. Before the calls, it folds the whole filled log (a bounded number of
//! rows per transaction), as an upgrade counts an existing log once, and prints how long
//! that took.
//!
//! The store also holds `--runs` runs (1,000,000 by default), one in 100,000 failed and
//! the rest completed, so the scrapes count them too (the store keeps the ended runs'
//! counts; the fill's inserts go through its triggers as any writer's do); at the end it
//! times a list of the failed runs, as an open console asks for it up to four times a
//! second.
//!
//! Run: `cargo bench -p runwarden-benches --bench scrape [-- --rows N --runs N --calls N
//! --every-ms N]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_mcp::{McpCall, McpClient, ServerConfig};
use runwarden_runtime::RunState;
use runwarden_runtime::store::{RunFilter, RunStore};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Dist, LoopbackVault, TestServer, loopback_vault, mcp_handler, tool};
use serde_json::json;

/// Calls in each block; the blocks alone and with the scraper alternate.
const BLOCK: usize = 100;

fn arg(name: &str, default: u64) -> u64 {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .map_or(default, |n| {
            n.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rows = arg("--rows", 2_000_000);
    let runs = arg("--runs", 1_000_000);
    let calls = arg("--calls", 2_000) as usize;
    let every = Duration::from_millis(arg("--every-ms", 250));

    let server = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let LoopbackVault {
        dir, store, egress, ..
    } = loopback_vault().await;
    let filled = Instant::now();
    fill(&dir.path().join("runwarden.db"), rows, runs);
    eprintln!(
        "filled the audit log with {rows} rows and {runs} runs in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    // The filled rows were written around the store, so none is folded into the counts
    // yet: folding them all is what migration 0023 does once to an existing log, and what
    // a scrape does after the log was wiped or restored.
    let folded = Instant::now();
    runwarden_vault::store::audit_rows_by_action(&store)
        .await
        .expect("the filled log folded");
    eprintln!(
        "folded the {rows} filled rows into their counts in {:.3} s",
        folded.elapsed().as_secs_f64()
    );
    let client = McpClient::new(ServerConfig::new("bench", server.url("/mcp")), egress);
    let call = || McpCall {
        tool: "echo".into(),
        arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
        ..Default::default()
    };
    for _ in 0..100 {
        assert!(client.call_tool(call(), None).await.result.is_success());
    }

    let (mut alone, mut beside, mut scrapes) = (Vec::new(), Vec::new(), Vec::new());
    for block in 0..calls.div_ceil(BLOCK) {
        let scraping = block % 2 == 1;
        let scraper = scraping.then(|| Scraper::start(store.clone(), every, rows, runs));
        for _ in 0..BLOCK {
            let started = Instant::now();
            let outcome = client.call_tool(call(), None).await;
            let took = started.elapsed();
            assert!(outcome.result.is_success());
            if scraping { &mut beside } else { &mut alone }.push(took);
        }
        if let Some(scraper) = scraper {
            scrapes.extend(scraper.stop().await);
        }
    }

    let first = scrapes.first().copied().unwrap_or_default();
    let later = scrapes.get(1..).unwrap_or_default().to_vec();
    let (alone, beside, first, later) = (
        Dist::new(alone),
        Dist::new(beside),
        Dist::new(vec![first]),
        Dist::new(later),
    );
    let mut lists = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let failed = store
            .run_list(RunFilter {
                status: Some(RunState::Failed),
                ..RunFilter::default()
            })
            .await
            .expect("the failed runs listed");
        lists.push(started.elapsed());
        // Run i failed when i % 100,000 is 7, for i from 1 to `runs`.
        assert_eq!(failed.len() as u64, (runs + 100_000 - 7) / 100_000);
    }
    let lists = Dist::new(lists);

    println!(
        "tools/call beside /metrics scrapes, {rows} audit rows, {runs} runs, a scrape every {every:?}"
    );
    println!(
        "{:<34} {:>8} {:>10} {:>10} {:>10}",
        "", "count", "p50", "p99", "max"
    );
    for (name, dist, count) in [
        ("calls alone", &alone, alone.len()),
        ("calls while scrapes run", &beside, beside.len()),
        ("first scrape", &first, first.len()),
        ("later scrapes", &later, later.len()),
        ("a list of the failed runs", &lists, lists.len()),
    ] {
        println!(
            "{name:<34} {count:>8} {:>8}µs {:>8}µs {:>8}µs",
            dist.pct(50.0).as_micros(),
            dist.pct(99.0).as_micros(),
            dist.max().as_micros()
        );
    }
}

/// Writes `rows` audit rows with ids from `-rows` to `-1`, in one transaction (calls,
/// half intents and half outcomes, a run id for every ten), and `runs` ended runs.
fn fill(path: &std::path::Path, rows: u64, runs: u64) {
    let conn = rusqlite::Connection::open(path).expect("the bench's database opens");
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO audit_log (id, time_ms, action, success, secret, method, host, path,
             status, duration_ms, error, reason, actor, correlation, prev_hash, hash, intent_id)
         SELECT -i, 1700000000000 + i,
             CASE i % 2 WHEN 0 THEN 'http_call_started' ELSE 'http_call_answered' END,
             1, NULL, 'POST', 'api.example.com', '/v1/tickets', 200, 12, NULL, NULL,
             'run', printf('0190%012d', i / 10), zeroblob(32), zeroblob(32),
             CASE i % 2 WHEN 0 THEN NULL ELSE 1 - i END
         FROM n",
        [rows],
    )
    .expect("the audit log fills");
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO runs (id, agent, status, request, correlation, created_ms, updated_ms)
         SELECT printf('0190%012d', i), 'helpdesk',
             CASE WHEN i % 100000 = 7 THEN 'failed' ELSE 'completed' END,
             NULL, printf('0190%012d', i), 1700000000000 + i, 1700000000000 + i
         FROM n",
        [runs],
    )
    .expect("the runs fill");
}

/// Counts as `GET /metrics` does, every `every`, until stopped.
struct Scraper {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Duration>>,
}

impl Scraper {
    fn start(store: SqliteStore, every: Duration, rows: u64, runs: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut took = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let started = Instant::now();
                let ran: u64 = store
                    .run_counts()
                    .await
                    .expect("runs counted")
                    .iter()
                    .map(|(_, n)| n)
                    .sum();
                assert!(ran >= runs, "{ran} runs counted of {runs}");
                let counts = runwarden_vault::store::audit_rows_by_action(&store)
                    .await
                    .expect("audit rows counted");
                let counted: u64 = counts.iter().map(|(_, n)| n).sum();
                assert!(counted >= rows, "{counted} audit rows counted of {rows}");
                took.push(started.elapsed());
                // The scrape interval: the next scrape is due, not a wait for a condition.
                tokio::time::sleep(every).await;
            }
            took
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<Duration> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the scraper ends")
    }
}
