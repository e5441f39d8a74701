//! Measures queued-run throughput of `runwarden worker` processes (1, 4 and 16 slots in
//! one process, and 1, 2 and 4 processes of 4 slots) on one SQLite file and on one
//! PostgreSQL database, and the time from `kill -9` of a worker to its run being requeued
//! (read-only call in flight) or dead-lettered (non-idempotent write in flight); run:
//! `cargo bench -p runwarden-benches --bench workers [-- --json] [throughput|recovery]
//! [sqlite|process_crash|postgres]` (the last picks the stores the throughput part measures).
//! On PostgreSQL it also reports what a run costs the server (`workers/pg_cost.rs`):
//! statements, transactions, WAL bytes, the server's and the workers' CPU time per run,
//! backends waiting for the audit chain's advisory lock, and the statements run most.
//! `BENCH_PG_DELAY_US=N` puts a network hop of N us each way between the workers and the
//! database (`workers/delay.rs`), as on a cluster. `BENCH_PG_FSYNC=on` runs PostgreSQL
//! with `fsync=on`, syncing at commit as a real server and SQLite here do (unset, the test
//! cluster's `fsync=off` makes PostgreSQL's figures an upper bound).
//!
//! Everything is the real release binary (`target/release/runwarden`: build it first with
//! `cargo build --release -p runwarden`; `common::built_binary` refuses a stale one) run as
//! child processes in a scratch installation,
//! against an MCP server from `runwarden-testkit` on 127.0.0.1, on its own one-worker
//! runtime so the workers' load does not queue its answers. PostgreSQL is the shared test
//! server when `RUNWARDEN_TEST_PG_URL` names one, else a cluster in a temporary directory
//! (`runwarden_testkit::TempCluster`), removed at the end.
//!
//! Throughput: [`runs`] runs are enqueued (`runwarden enqueue`, one process each, four at
//! a time; the enqueue latency is reported too), then the worker processes start together.
//! A scripted agent (instant) calls an instant read-only MCP tool once and then answers.
//! With `BENCH_EXTRA_TOOLS=N` the server offers N more tools, imported into the catalogue
//! but bound by no agent, to show what the catalogue's size costs a run. `BENCH_LAYOUTS`
//! (for example `1x16,2x4`) measures the layouts it names instead of the table's.
//! "runs/s" is the runs divided by the time from spawning the workers to the last outcome
//! line (process start included); "steady runs/s" is one run fewer over first to last
//! outcome line. Each layout is measured three times; the table shows the median and the
//! range, and the ratio of the median to one slot's on the same store, measured in the
//! same run; a second table puts the two stores side by side.
//!
//! Recovery: lease 1 s, heartbeat 0.3 s, reaper every 0.2 s. A victim worker (one slot)
//! claims a run whose tool call the server holds; a standby worker is up and has completed
//! a run of its own. The victim gets `kill -9`; a sample is the instant the standby's
//! reaper logs the recovery of that run minus the instant of the kill. For the read-only
//! call, the standby then claims and completes the run (reported too). Every trial checks
//! the end state: read-only completed with 2 attempts; the write failed `FENCED_WRITE` with
//! its `pending_effect` kept and exactly one `tools/call` on the server.

mod common;
#[path = "workers/delay.rs"]
mod delay;
#[path = "workers/pg_cost.rs"]
mod pg_cost;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

/// How many tools the MCP server offers beyond the agents' own (`BENCH_EXTRA_TOOLS`, 0
/// unless set): the imported catalogue's size, which the agents do not bind.
fn extra_tools() -> usize {
    std::env::var("BENCH_EXTRA_TOOLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The layouts `BENCH_LAYOUTS` names (for example `1x16,2x4`: processes x slots), when
/// set: a quicker loop while working on one layout, or one the table does not have.
fn layouts_asked() -> Option<Vec<(usize, usize)>> {
    let list = std::env::var("BENCH_LAYOUTS").ok()?;
    let layouts = list
        .split(',')
        .map(|l| {
            let (p, s) = l.trim().split_once('x')?;
            Some((p.parse().ok()?, s.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>();
    Some(layouts.unwrap_or_else(|| panic!("BENCH_LAYOUTS={list}: write layouts as 1x16,2x4")))
}

/// Whether PostgreSQL syncs its WAL at commit (`BENCH_PG_FSYNC=on`), as a real server
/// does and as SQLite does here by default: a cluster of the bench's own with `fsync=on`.
/// Unset, the test cluster runs with `fsync=off`, an upper bound for a real disk.
fn synced_postgres() -> bool {
    std::env::var("BENCH_PG_FSYNC").is_ok_and(|v| v == "on")
}

/// Runs per throughput measurement: `BENCH_RUNS`, or 400 when unset. More runs weigh a
/// worker's start and its last runs, when few slots are busy, less.
fn runs() -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 1)
        .unwrap_or(400)
}
/// Threads running `runwarden enqueue` at once while the queue is filled.
const ENQUEUERS: usize = 4;
/// Measurements per worker layout.
const REPS: usize = 3;
/// Kill -9 trials per kind of call in flight.
const TRIALS: usize = 10;
/// A bound on a step that should take milliseconds; it only fails a hung benchmark.
const WAIT: Duration = Duration::from_secs(20);
/// Throughput: leases long enough never to lapse; the heartbeat seldom fires.
const THROUGHPUT_SETTINGS: &str = "lease_seconds = 30.0\nheartbeat_seconds = 10.0\n";
/// Recovery: the short lease the figures are quoted for.
const RECOVERY_SETTINGS: &str =
    "lease_seconds = 1.0\nheartbeat_seconds = 0.3\nreap_seconds = 0.2\nretry_base_seconds = 0.05\n";
const LEASE: Duration = Duration::from_secs(1);
const REAP_EVERY: Duration = Duration::from_millis(200);

/// The MCP server: `lookup` (read-only) answers at once; `create` (a non-idempotent write)
/// never answers; `search` (read-only) stalls its odd-numbered calls and answers the even
/// ones, so in sequential trials the victim's call stalls and the standby's is answered.
struct Server {
    server: TestServer,
    runtime: tokio::runtime::Runtime,
    creates: Arc<AtomicUsize>,
}

impl Server {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the server");
        let creates = Arc::new(AtomicUsize::new(0));
        let searches = Arc::new(AtomicUsize::new(0));
        let mut tools = vec![tool("create"), tool("search"), tool("lookup")];
        tools.extend((0..extra_tools()).map(|i| {
            json!({"name": format!("extra_{i}"), "description": "Reads a record by its id and answers with the fields asked for.",
                "inputSchema": {"type": "object", "required": ["id"], "properties": {
                    "id": {"type": "string", "description": "The record's id"},
                    "fields": {"type": "array", "items": {"type": "string"}}}}})
        }));
        let answer = mcp_handler(tools, &[]);
        let counted = creates.clone();
        let handler = move |request: &HttpRequest| {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            if body["method"] == "tools/call" {
                match body["params"]["name"].as_str() {
                    Some("create") => {
                        counted.fetch_add(1, Ordering::SeqCst);
                        return HttpReply::Stall;
                    }
                    Some("search") if searches.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) => {
                        return HttpReply::Stall;
                    }
                    _ => {}
                }
            }
            answer(request)
        };
        let server = runtime.block_on(TestServer::start(handler));
        Self {
            server,
            runtime,
            creates,
        }
    }

    /// Waits until the server holds (or answered) a `tools/call` of `tool`.
    fn until_call(&mut self, tool: &str) {
        let server = &mut self.server;
        self.runtime.block_on(async {
            loop {
                let request = server.next_request(WAIT).await;
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                if body["method"] == "tools/call" && body["params"]["name"] == tool {
                    return;
                }
            }
        });
    }

    fn forget_requests(&mut self) {
        self.server.drain_requests();
    }
}

/// Where an installation keeps its runs.
enum Store {
    /// The embedded default: one SQLite file in the data directory.
    Sqlite,
    /// The same with the operator's faster `[store] durability = "process_crash"`.
    SqliteProcessCrash,
    /// A database of a PostgreSQL server (O3 amended), by URL.
    Postgres(String),
}

impl Store {
    fn name(&self) -> &'static str {
        match self {
            Store::Sqlite => "SQLite",
            Store::SqliteProcessCrash => "SQLite, process_crash",
            Store::Postgres(_) => "PostgreSQL",
        }
    }
}

/// A scratch installation on `store`: `runwarden init`, loopback admitted, the server
/// imported as `srv`, and the agents `instant` (lookup, then answer), `reader` (search,
/// then answer), `writer` (create, then answer) and `quick` (answers at once).
struct Install {
    dir: tempfile::TempDir,
}

impl Install {
    fn new(server: &mut Server, worker_settings: &str, store: &Store) -> Self {
        let install = Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        let mut init = install.command(&["init"]);
        if let Store::Postgres(url) = store {
            init.env("RUNWARDEN_DATABASE_URL", url);
        }
        let out = init.output().expect("the binary runs");
        assert!(
            out.status.success(),
            "runwarden init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut text = std::fs::read_to_string(install.config()).expect("init wrote the config");
        match store {
            Store::Postgres(url) => {
                text = text.replace("\n[store]\n", &format!("\n[store]\nurl = \"{url}\"\n"));
            }
            Store::SqliteProcessCrash => {
                text = text.replace("\n[store]\n", "\n[store]\ndurability = \"process_crash\"\n");
            }
            Store::Sqlite => {}
        }
        text = text.replace("\nallow = []\n", "\nallow = [\"127.0.0.1\"]\n");
        let template: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("lease_seconds = ") || l.starts_with("heartbeat_seconds = "))
            .map(|l| format!("{l}\n"))
            .collect();
        for line in template {
            text = text.replace(&line, "");
        }
        text = text.replace("\n[worker]\n", &format!("\n[worker]\n{worker_settings}"));
        text.push_str(&format!(
            "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[mcp.servers.srv.tools.search]\neffect = \"read_only\"\n\n[mcp.servers.srv.tools.lookup]\neffect = \"read_only\"\n",
            server.server.url("/mcp")
        ));
        let call = |tool: &str| json!([{"tool_calls": [{"name": format!("srv__{tool}"), "arguments": {"q": "x"}}]}, {"text": "done"}]);
        let agents = [
            ("instant", call("lookup")),
            ("reader", call("search")),
            ("writer", call("create")),
            ("quick", json!([{"text": "done"}])),
        ];
        for (name, plan) in agents {
            text.push_str(&format!(
                "\n[agents.{name}]\nprovider = \"scripted\"\nscript = \"{name}.json\"\ntools = [\"srv__lookup\", \"srv__search\", \"srv__create\"]\n"
            ));
            std::fs::write(
                install.path().join(format!("{name}.json")),
                plan.to_string(),
            )
            .expect("the plan is writable");
        }
        std::fs::write(install.config(), text).expect("the config is writable");
        install.ok(&["mcp", "import", "srv"]);
        server.forget_requests();
        install
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        self.path().join("runwarden.toml")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = common::command(&self.config(), args);
        command.current_dir(self.path());
        command
    }

    /// Runs the binary to its end; it must succeed. Returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args).output().expect("the binary runs");
        assert!(
            out.status.success(),
            "runwarden {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn enqueue(&self, agent: &str, prompt: &str) -> String {
        self.ok(&["enqueue", "--agent", agent, prompt])
            .trim()
            .to_string()
    }

    fn status(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["--json", "status", id])).expect("status is JSON")
    }

    fn worker(&self, concurrency: usize, lines: &mpsc::Sender<Line>, tag: usize) -> Worker {
        let n = concurrency.to_string();
        let mut command = self.command(&["--json", "worker", "--concurrency", &n]);
        command
            .env("RUNWARDEN_LOG", "runwarden_runtime::worker=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the worker starts");
        forward(
            child.stdout.take().expect("piped"),
            lines.clone(),
            tag,
            false,
        );
        forward(
            child.stderr.take().expect("piped"),
            lines.clone(),
            tag,
            true,
        );
        Worker { child }
    }
}

/// One line a worker printed, stamped when it arrived.
struct Line {
    at: Instant,
    worker: usize,
    stderr: bool,
    text: String,
}

fn forward(
    reader: impl Read + Send + 'static,
    tx: mpsc::Sender<Line>,
    worker: usize,
    stderr: bool,
) {
    std::thread::spawn(move || {
        for text in BufReader::new(reader).lines() {
            let Ok(text) = text else { break };
            let line = Line {
                at: Instant::now(),
                worker,
                stderr,
                text,
            };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

struct Worker {
    child: std::process::Child,
}

impl Worker {
    /// SIGTERM, then waits for the exit.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    /// SIGKILL (`kill -9`); returns the instant it was sent, then reaps the process.
    fn kill_9(mut self) -> Instant {
        let at = Instant::now();
        self.child.kill().expect("kill -9 the worker");
        let _ = self.child.wait();
        at
    }
}

/// Receives lines until `pick` says yes; the matching line. On a timeout, the lines seen
/// meanwhile are in the panic message.
fn until(rx: &mpsc::Receiver<Line>, what: &str, mut pick: impl FnMut(&Line) -> bool) -> Line {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            panic!("no {what} within {WAIT:?}; lines meanwhile: {seen:#?}");
        };
        if pick(&line) {
            return line;
        }
        seen.push(format!("worker {}: {}", line.worker, line.text));
    }
}

fn outcome(line: &Line) -> Option<(String, String)> {
    if line.stderr {
        return None;
    }
    let value: Value = serde_json::from_str(&line.text).ok()?;
    Some((
        value["run_id"].as_str()?.to_string(),
        value["outcome"].as_str()?.to_string(),
    ))
}

/// A duration uniformly below `bound`, from the standard library's per-process random
/// hash keys (no dependency needed for a phase offset).
fn random_below(bound: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    let nanos = bound.as_nanos() as u64;
    Duration::from_nanos(hasher.finish() % nanos.max(1))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

/// The throughput of one layout: `processes` workers of `slots` each over [`runs`] runs.
/// Returns (runs/s, steady runs/s, enqueue latencies in ms).
fn throughput(
    install: &Install,
    processes: usize,
    slots: usize,
    meter: Option<&pg_cost::PgMeter>,
) -> (f64, f64, Vec<f64>, Option<pg_cost::Cost>) {
    let enqueue_ms: Vec<f64> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..ENQUEUERS)
            .map(|t| {
                scope.spawn(move || {
                    (t..runs())
                        .step_by(ENQUEUERS)
                        .map(|n| {
                            let started = Instant::now();
                            install.enqueue("instant", &format!("run {n}"));
                            started.elapsed().as_secs_f64() * 1e3
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("an enqueuer thread"))
            .collect()
    });
    let (tx, rx) = mpsc::channel();
    let metered = meter.map(pg_cost::PgMeter::start);
    let started = Instant::now();
    let workers: Vec<Worker> = (0..processes)
        .map(|w| install.worker(slots, &tx, w))
        .collect();
    let mut done = std::collections::BTreeSet::new();
    let (mut first, mut last) = (None, started);
    while done.len() < runs() {
        let line = until(&rx, "outcome line", |l| outcome(l).is_some());
        let (id, outcome) = outcome(&line).expect("picked");
        assert_eq!(outcome, "completed", "run {id} (worker {})", line.worker);
        assert!(done.insert(id.clone()), "run {id} finished twice");
        first.get_or_insert(line.at);
        last = line.at;
    }
    let total = last.duration_since(started).as_secs_f64();
    let steady = last
        .duration_since(first.expect("runs finished"))
        .as_secs_f64();
    let cost = meter.zip(metered).map(|(meter, metered)| {
        let worker_cpu = workers
            .iter()
            .map(|w| runwarden_benches::cpu_time_of(Some(w.child.id()), false))
            .sum();
        meter.finish(metered, runs() as u64, worker_cpu)
    });
    for worker in workers {
        worker.stop();
    }
    (
        runs() as f64 / total,
        (runs() - 1) as f64 / steady,
        enqueue_ms,
        cost,
    )
}

/// One recovery trial; (kill -> recovered, kill -> completed if read-only, lease left at
/// the kill) in ms.
fn recovery(install: &Install, server: &mut Server, agent: &str) -> (f64, Option<f64>, f64) {
    // The previous trial's requests are all answered or closed: only this trial's count.
    server.forget_requests();
    let (tx, rx) = mpsc::channel();
    let victim = install.worker(1, &tx, 0);
    let id = install.enqueue(agent, "recover me");
    server.until_call(if agent == "writer" {
        "create"
    } else {
        "search"
    });
    let standby = install.worker(4, &tx, 1);
    // The victim's only slot is busy, so the standby runs this one: it is up and polling.
    let sentinel = install.enqueue("quick", "sentinel");
    until(&rx, "sentinel outcome", |l| {
        l.worker == 1 && outcome(l).is_some_and(|(id, _)| id == sentinel)
    });

    // A random phase against the victim's heartbeat and the standby's reaper ticks: with
    // no offset every trial would kill at the same phase and sample one point.
    std::thread::sleep(random_below(LEASE));
    let writes_before = server.creates.load(Ordering::SeqCst);
    let killed = victim.kill_9();
    let killed_wall = chrono::Utc::now();
    let stale = install.status(&id);
    let expires = chrono::DateTime::parse_from_rfc3339(stale["lease_expires"].as_str().unwrap())
        .expect("RFC 3339");
    let lease_left = (expires.with_timezone(&chrono::Utc) - killed_wall).num_milliseconds() as f64;
    let rescued = until(&rx, "reaper line", |l| {
        l.stderr && l.text.contains("the reaper recovered a stale run") && l.text.contains(&id)
    });
    let recovered = rescued.at.duration_since(killed).as_secs_f64() * 1e3;
    let completed = if agent == "reader" {
        let line = until(&rx, "outcome of the recovered run", |l| {
            l.worker == 1 && outcome(l).is_some_and(|(run, _)| run == id)
        });
        Some(line.at.duration_since(killed).as_secs_f64() * 1e3)
    } else {
        None
    };
    standby.stop();

    let end = install.status(&id);
    if agent == "writer" {
        assert_eq!(end["status"], "failed", "{end:#}");
        assert!(
            end["termination_reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("FENCED_WRITE")),
            "{end:#}"
        );
        assert_eq!(end["pending_effect"], "non_idempotent_write", "{end:#}");
        assert_eq!(
            server.creates.load(Ordering::SeqCst),
            writes_before,
            "no second write"
        );
    } else {
        assert_eq!(end["status"], "completed", "{end:#}");
        assert_eq!(end["attempts"], 2, "{end:#}");
    }
    (recovered, completed, lease_left)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json_out = args.iter().any(|a| a == "--json");
    // `cargo bench` adds `--bench`; a bare word picks one part: `throughput` or `recovery`.
    let picked: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let parts = ["throughput", "recovery"];
    let wants = |part: &str| !picked.iter().any(|w| parts.contains(w)) || picked.contains(&part);
    let mut server = Server::start();
    if wants("throughput") {
        // `sqlite`, `process_crash` or `postgres` measure that store alone.
        let only: Vec<&str> = picked
            .iter()
            .copied()
            .filter(|w| ["sqlite", "process_crash", "postgres"].contains(w))
            .collect();
        throughput_table(&mut server, json_out, &only);
    }
    if wants("recovery") {
        recovery_table(&mut server, json_out);
    }
}

/// `url` itself, or with `BENCH_PG_DELAY_US` set, the same database through a delay proxy
/// (`workers/delay.rs`); prints the round trip measured through it.
fn behind_the_delay(runtime: &tokio::runtime::Runtime, url: String) -> String {
    let Some(one_way) = delay::asked() else {
        return url;
    };
    let mut parsed = url::Url::parse(&url).expect("the test database's URL parses");
    let upstream = parsed
        .socket_addrs(|| Some(5432))
        .expect("the test database's address")[0];
    let port = delay::start(upstream, one_way);
    parsed.set_port(Some(port)).expect("a URL with a port");
    let proxied = parsed.to_string();
    let (p50, p99) = delay::round_trip(runtime, &proxied);
    let (direct, _) = delay::round_trip(runtime, &url);
    println!(
        "The workers reach PostgreSQL through a delay proxy ({} us each way): `SELECT 1` \
         round trip p50 {p50:.0} us, p99 {p99:.0} us (direct: p50 {direct:.0} us).\n",
        one_way.as_micros()
    );
    proxied
}

fn throughput_table(server: &mut Server, json_out: bool, only: &[&str]) {
    // A PostgreSQL server for the second half: the shared test cluster when
    // RUNWARDEN_TEST_PG_URL names one, else one in a temporary directory, removed on exit.
    let picked = |word: &str| only.is_empty() || only.contains(&word);
    let cluster = picked("postgres").then(|| {
        if synced_postgres() {
            runwarden_testkit::TempCluster::start_owned_synced()
        } else {
            runwarden_testkit::TempCluster::start()
        }
    });
    let mut stores = Vec::new();
    if picked("sqlite") {
        stores.push(Store::Sqlite);
    }
    if picked("process_crash") {
        stores.push(Store::SqliteProcessCrash);
    }
    // The statistics are read straight from the server; the workers go through the delay
    // proxy when one is asked for.
    let mut direct_url = None;
    if let Some(cluster) = &cluster {
        let url = server.runtime.block_on(cluster.fresh_database());
        direct_url = Some(url.clone());
        stores.push(Store::Postgres(behind_the_delay(&server.runtime, url)));
    }
    println!(
        "## Queued-run throughput ({} runs, instant scripted agent + instant read-only tool)\n",
        runs()
    );
    println!(
        "| store | layout | slots | runs/s (median of {REPS}) | range | steady runs/s | vs 1 slot |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut side_by_side: Vec<(usize, Vec<f64>)> = Vec::new();
    let mut costs: Vec<(usize, usize, f64, pg_cost::Cost)> = Vec::new();
    let mut last_meter = None;
    for store in &stores {
        let install = Install::new(server, THROUGHPUT_SETTINGS, store);
        let meter = match store {
            Store::Postgres(_) => direct_url.as_deref().map(pg_cost::PgMeter::connect),
            _ => None,
        };
        let mut enqueue_ms = Vec::new();
        let mut baseline = None;
        let asked = layouts_asked();
        let layouts: &[(usize, usize)] = match store {
            _ if asked.is_some() => asked.as_deref().unwrap_or_default(),
            Store::Sqlite | Store::SqliteProcessCrash => &[(1, 1), (1, 4), (1, 16), (2, 4), (4, 4)],
            Store::Postgres(_) => &[(1, 1), (1, 4), (2, 4), (4, 4)],
        };
        for &(processes, slots) in layouts {
            let mut rates = Vec::new();
            let mut steady = Vec::new();
            let mut cost = pg_cost::Cost::default();
            for _ in 0..REPS {
                let (rate, steady_rate, enqueues, spent) =
                    throughput(&install, processes, slots, meter.as_ref());
                rates.push(rate);
                steady.push(steady_rate);
                enqueue_ms.extend(enqueues);
                cost.add(spent.unwrap_or_default());
            }
            let (rates, steady) = (sorted(rates), sorted(steady));
            let median = rates[REPS / 2];
            if meter.is_some() {
                costs.push((processes, slots, median, cost));
            }
            let base = *baseline.get_or_insert(median);
            if slots == 4 && !matches!(store, Store::SqliteProcessCrash) {
                match side_by_side.iter_mut().find(|(p, _)| *p == processes) {
                    Some((_, row)) => row.push(median),
                    None => side_by_side.push((processes, vec![median])),
                }
            }
            let layout = format!(
                "{processes} process{} x {slots}",
                if processes > 1 { "es" } else { "" }
            );
            println!(
                "| {} | {layout} | {} | {median:.0} | {:.0}-{:.0} | {:.0} | {:.2}x |",
                store.name(),
                processes * slots,
                rates[0],
                rates[REPS - 1],
                steady[REPS / 2],
                median / base
            );
            if json_out {
                println!(
                    "{}",
                    json!({"bench": "workers", "figure": "throughput", "store": store.name(),
                           "processes": processes, "slots": slots,
                           "runs": runs(), "runs_per_s_median": median, "runs_per_s_min": rates[0],
                           "runs_per_s_max": rates[REPS - 1], "steady_runs_per_s_median": steady[REPS / 2],
                           "ratio_vs_1_slot": median / base})
                );
            }
        }
        let enqueue_ms = sorted(enqueue_ms);
        println!(
            "| {} | `runwarden enqueue` (a whole process) | | p50 {:.1} ms | p99 {:.1} ms | {} calls | |",
            store.name(),
            percentile(&enqueue_ms, 50.0),
            percentile(&enqueue_ms, 99.0),
            enqueue_ms.len()
        );
        if json_out {
            println!(
                "{}",
                json!({"bench": "workers", "figure": "enqueue_process_ms", "store": store.name(),
                       "samples": enqueue_ms.len(),
                       "p50": percentile(&enqueue_ms, 50.0), "p99": percentile(&enqueue_ms, 99.0)})
            );
        }
        if meter.is_some() {
            last_meter = meter;
        }
    }
    println!("\nWorker processes of 4 slots each, runs/s (median of {REPS}), same run:\n");
    println!("| worker processes | SQLite | PostgreSQL | PostgreSQL / SQLite |");
    println!("| ---: | ---: | ---: | ---: |");
    for (processes, row) in &side_by_side {
        if let [sqlite, postgres] = row[..] {
            println!(
                "| {processes} | {sqlite:.0} | {postgres:.0} | {:.2}x |",
                postgres / sqlite
            );
        }
    }
    println!();
    pg_cost::print(&costs, json_out);
    if let Some(meter) = &last_meter {
        let runs = costs.iter().map(|(_, _, _, cost)| cost.runs).sum();
        meter.print_statements(runs);
    }
    drop(cluster);
}

fn recovery_table(server: &mut Server, json_out: bool) {
    println!(
        "## Recovery after kill -9 (lease {} s, heartbeat 0.3 s, reaper every {} s, {TRIALS} trials each)\n",
        LEASE.as_secs_f64(),
        REAP_EVERY.as_secs_f64()
    );
    println!(
        "| call in flight | action | p50 ms | max ms | lease left at kill p50 ms | reaper after expiry max ms | kill -> completed p50 ms |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let install = Install::new(server, RECOVERY_SETTINGS, &Store::Sqlite);
    for (agent, call, action) in [
        ("reader", "read-only", "requeued"),
        (
            "writer",
            "non-idempotent write",
            "dead-lettered FENCED_WRITE",
        ),
    ] {
        let mut recovered = Vec::new();
        let mut completed = Vec::new();
        let mut left = Vec::new();
        let mut after_expiry = Vec::new();
        for _ in 0..TRIALS {
            let (r, c, l) = recovery(&install, server, agent);
            recovered.push(r);
            completed.extend(c);
            left.push(l);
            after_expiry.push(r - l);
        }
        let (recovered, completed, left, after_expiry) = (
            sorted(recovered),
            sorted(completed),
            sorted(left),
            sorted(after_expiry),
        );
        let completed_p50 = (!completed.is_empty()).then(|| percentile(&completed, 50.0));
        println!(
            "| {call} | {action} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
            percentile(&recovered, 50.0),
            recovered[TRIALS - 1],
            percentile(&left, 50.0),
            after_expiry[TRIALS - 1],
            completed_p50.map_or("-".into(), |c| format!("{c:.0}"))
        );
        if json_out {
            println!(
                "{}",
                json!({"bench": "workers", "figure": "kill9_recovery_ms", "call": call, "action": action,
                       "trials": TRIALS, "lease_ms": LEASE.as_millis() as u64, "reap_ms": REAP_EVERY.as_millis() as u64,
                       "p50": percentile(&recovered, 50.0), "max": recovered[TRIALS - 1],
                       "lease_left_p50": percentile(&left, 50.0), "after_expiry_max": after_expiry[TRIALS - 1],
                       "completed_p50": completed_p50})
            );
        }
    }
}
