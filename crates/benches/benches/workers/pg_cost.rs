//! What a queued run costs the PostgreSQL server, for the model of how runs/s grow with
//! nodes: statements and transactions (`pg_stat_statements`, when the server loads it),
//! WAL bytes (`pg_current_wal_lsn`), the server's CPU time (every `postgres` process on
//! this machine, from `/proc`), the worker processes' CPU time, and how often a backend
//! waits for an advisory lock (the audit chain's), sampled from `pg_stat_activity`
//! every 5 ms while the runs execute.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// The server's side of a run, summed over the measurements of one layout.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cost {
    pub runs: u64,
    /// Statements other than BEGIN, COMMIT and ROLLBACK; `None` without pg_stat_statements.
    pub statements: Option<u64>,
    /// Transactions opened with BEGIN or START TRANSACTION.
    pub transactions: Option<u64>,
    pub wal_bytes: u64,
    pub db_cpu: Duration,
    pub worker_cpu: Duration,
    /// Samples taken, and the backends seen waiting for an advisory lock over all of them.
    pub samples: u64,
    pub advisory_waiters: u64,
    pub samples_with_a_waiter: u64,
    /// The whole machine's CPU time (every core, `/proc/stat`) and the idle part of it,
    /// in clock ticks: whether the layout ran out of CPU or waited on something else.
    pub machine_ticks: u64,
    pub idle_ticks: u64,
}

impl Cost {
    pub(crate) fn add(&mut self, other: Cost) {
        self.runs += other.runs;
        self.statements = sum(self.statements, other.statements);
        self.transactions = sum(self.transactions, other.transactions);
        self.wal_bytes += other.wal_bytes;
        self.db_cpu += other.db_cpu;
        self.worker_cpu += other.worker_cpu;
        self.samples += other.samples;
        self.advisory_waiters += other.advisory_waiters;
        self.samples_with_a_waiter += other.samples_with_a_waiter;
        self.machine_ticks += other.machine_ticks;
        self.idle_ticks += other.idle_ticks;
    }

    pub(crate) fn per_run(&self, n: u64) -> f64 {
        n as f64 / self.runs.max(1) as f64
    }

    pub(crate) fn ms_per_run(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e3 / self.runs.max(1) as f64
    }
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a.unwrap_or(0) + b?)
}

/// A connection to the bench's database server, on a runtime of its own.
pub(crate) struct PgMeter {
    runtime: tokio::runtime::Runtime,
    client: Client,
    admin_url: String,
    database: String,
    has_statements: bool,
    /// Calls and total ms of each statement over every measurement.
    by_query: RefCell<HashMap<String, (u64, f64)>>,
}

/// The counters at the start of a measurement.
pub(crate) struct Started {
    lsn: String,
    db_cpu: Duration,
    machine: (u64, u64),
    sampler: Sampler,
}

impl PgMeter {
    /// `url` is the bench database's; the meter connects to the server's `postgres`
    /// database, so its own queries are not counted against the bench's.
    pub(crate) fn connect(url: &str) -> Self {
        let (base, database) = url.rsplit_once('/').expect("a database URL");
        let admin_url = format!("{base}/postgres");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the meter's runtime");
        let client = runtime.block_on(connect(&admin_url));
        let has_statements = runtime
            .block_on(client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            .is_ok()
            && runtime
                .block_on(client.query_one("SELECT count(*) FROM pg_stat_statements", &[]))
                .is_ok();
        Self {
            runtime,
            client,
            admin_url,
            database: database.to_string(),
            has_statements,
            by_query: RefCell::default(),
        }
    }

    pub(crate) fn start(&self) -> Started {
        if self.has_statements {
            let reset = self.runtime.block_on(
                self.client
                    .query_one("SELECT pg_stat_statements_reset()", &[]),
            );
            reset.expect("resetting the statement counts");
        }
        Started {
            lsn: self.lsn(),
            db_cpu: postgres_cpu(),
            machine: machine_ticks(),
            sampler: Sampler::start(&self.admin_url, &self.database),
        }
    }

    /// The cost of `runs` runs since `started`; `worker_cpu` is the workers' CPU time.
    pub(crate) fn finish(&self, started: Started, runs: u64, worker_cpu: Duration) -> Cost {
        let (samples, advisory_waiters, samples_with_a_waiter) = started.sampler.stop();
        let db_cpu = postgres_cpu().saturating_sub(started.db_cpu);
        let (all, idle) = machine_ticks();
        let wal: i64 = self
            .runtime
            .block_on(self.client.query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::TEXT::pg_lsn)::BIGINT",
                &[&started.lsn],
            ))
            .expect("reading the WAL position")
            .get(0);
        let counted = self.statements().map(|rows| {
            let (mut statements, mut transactions) = (0, 0);
            let mut kept = self.by_query.borrow_mut();
            for (query, calls, ms) in rows {
                match query.to_ascii_uppercase().as_str() {
                    "BEGIN" | "START TRANSACTION" => transactions += calls,
                    "COMMIT" | "ROLLBACK" => {}
                    _ => statements += calls,
                }
                let entry = kept.entry(query).or_default();
                entry.0 += calls;
                entry.1 += ms;
            }
            (statements, transactions)
        });
        Cost {
            runs,
            statements: counted.map(|(s, _)| s),
            transactions: counted.map(|(_, t)| t),
            wal_bytes: wal.max(0) as u64,
            db_cpu,
            worker_cpu,
            samples,
            advisory_waiters,
            samples_with_a_waiter,
            machine_ticks: all.saturating_sub(started.machine.0),
            idle_ticks: idle.saturating_sub(started.machine.1),
        }
    }

    fn lsn(&self) -> String {
        self.runtime
            .block_on(
                self.client
                    .query_one("SELECT pg_current_wal_lsn()::TEXT", &[]),
            )
            .expect("reading the WAL position")
            .get(0)
    }

    /// Each statement the bench database ran since the last reset: (text, calls, ms).
    fn statements(&self) -> Option<Vec<(String, u64, f64)>> {
        if !self.has_statements {
            return None;
        }
        let rows = self
            .runtime
            .block_on(self.client.query(
                "SELECT query, calls, total_exec_time FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)",
                &[&self.database],
            ))
            .ok()?;
        Some(
            rows.iter()
                .map(|row| {
                    let query: String = row.get(0);
                    let words: Vec<&str> = query.split_whitespace().collect();
                    (words.join(" "), row.get::<_, i64>(1) as u64, row.get(2))
                })
                .collect(),
        )
    }

    /// The statements the runs made most often, with calls per run and mean time.
    pub(crate) fn print_statements(&self, runs: u64) {
        let kept = self.by_query.borrow();
        if kept.is_empty() {
            return;
        }
        let mut rows: Vec<_> = kept.iter().collect();
        rows.sort_by_key(|(_, (calls, _))| std::cmp::Reverse(*calls));
        println!("Statements per run on PostgreSQL, every layout together (pg_stat_statements):\n");
        println!("| calls per run | mean ms | statement |");
        println!("| ---: | ---: | --- |");
        for (query, (calls, ms)) in rows.into_iter().take(STATEMENTS_SHOWN) {
            let short: String = query.chars().take(110).collect();
            println!(
                "| {:.2} | {:.3} | `{short}` |",
                *calls as f64 / runs.max(1) as f64,
                ms / (*calls).max(1) as f64
            );
        }
        println!();
    }
}

/// Rows of the statement table.
const STATEMENTS_SHOWN: usize = 25;

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("the meter connects to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// A thread that counts the bench database's backends waiting for an advisory lock.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(u64, u64, u64)>,
}

impl Sampler {
    fn start(admin_url: &str, database: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, database, flag) = (admin_url.to_string(), database.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the sampler's runtime");
            runtime.block_on(async move {
                let client = connect(&url).await;
                let (mut samples, mut waiters, mut with_one) = (0, 0, 0);
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                while !flag.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let Ok(row) = client
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity
                             WHERE datname = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                            &[&database],
                        )
                        .await
                    else {
                        continue;
                    };
                    let n = row.get::<_, i64>(0) as u64;
                    samples += 1;
                    waiters += n;
                    with_one += u64::from(n > 0);
                }
                (samples, waiters, with_one)
            })
        });
        Self { stop, thread }
    }

    fn stop(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

/// CPU time of every `postgres` process on this machine, with what the postmasters'
/// exited children (backends whose connection closed) took.
/// The machine's CPU ticks since boot, all and idle (idle and iowait), from `/proc/stat`.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (ticks.iter().take(8).sum(), idle)
}

fn postgres_cpu() -> Duration {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == "postgres")
        })
        .map(|pid| runwarden_benches::cpu_time_of(Some(pid), true))
        .sum()
}

/// The table of what a run costs the server, one row per layout (processes, slots, the
/// median runs/s, the cost over its measurements).
pub(crate) fn print(costs: &[(usize, usize, f64, Cost)], json_out: bool) {
    if costs.is_empty() {
        return;
    }
    println!("What a run costs PostgreSQL, per run (all measurements of the layout):\n");
    println!(
        "| layout | runs/s | statements | transactions | WAL KiB | server CPU ms | worker CPU ms | backends waiting for an advisory lock (mean) | samples with one waiting | machine idle |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let shown = |n: Option<u64>, cost: &Cost| {
        n.map_or("n/a".to_string(), |n| format!("{:.1}", cost.per_run(n)))
    };
    for (processes, slots, median, cost) in costs {
        let waiting = cost.advisory_waiters as f64 / cost.samples.max(1) as f64;
        let with_one = 100.0 * cost.samples_with_a_waiter as f64 / cost.samples.max(1) as f64;
        let idle = 100.0 * cost.idle_ticks as f64 / cost.machine_ticks.max(1) as f64;
        println!(
            "| {processes} x {slots} | {median:.0} | {} | {} | {:.1} | {:.2} | {:.2} | {waiting:.2} | {with_one:.0} % | {idle:.0} % |",
            shown(cost.statements, cost),
            shown(cost.transactions, cost),
            cost.per_run(cost.wal_bytes) / 1024.0,
            cost.ms_per_run(cost.db_cpu),
            cost.ms_per_run(cost.worker_cpu),
        );
        if json_out {
            println!(
                "{}",
                serde_json::json!({"bench": "workers", "figure": "postgres_cost_per_run",
                    "processes": processes, "slots": slots, "runs_per_s_median": median,
                    "statements": cost.statements.map(|n| cost.per_run(n)),
                    "transactions": cost.transactions.map(|n| cost.per_run(n)),
                    "wal_bytes": cost.per_run(cost.wal_bytes),
                    "server_cpu_ms": cost.ms_per_run(cost.db_cpu),
                    "worker_cpu_ms": cost.ms_per_run(cost.worker_cpu),
                    "advisory_waiters_mean": waiting, "samples_with_a_waiter_pct": with_one,
                    "machine_idle_pct": idle})
            );
        }
    }
    println!();
}
