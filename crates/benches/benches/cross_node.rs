//! Measures a cancel through the HTTP API of node A (`runwarden serve`) while the run's
//! tool call is on the wire, from the API answering `POST /v1/runs/{id}/cancel` to the MCP
//! server seeing the call's connection close, in four layouts side by side in one run:
//!
//! - same node, SQLite: the call runs in serve's own worker slot (woken by its cancel hub);
//! - same node, PostgreSQL: the same on a PostgreSQL store;
//! - cross node, PostgreSQL: serve has no worker slot (`--concurrency 0`); the call runs in
//!   a `runwarden worker` process, which learns of the cancel from the store: NOTIFY on the
//!   change feed where the process's status watcher listens, else its own reads (R6);
//! - poll-only, SQLite: the same two processes on one SQLite file, where nothing crosses
//!   between processes but the worker's own reads of the row (and the file watch's resync).
//!
//! Where the call runs in a worker process, each cancel waits a random phase (below the
//! call's 1 s read interval) after the call is on the wire, so the figure samples every
//! phase of that read; the same-node layouts cancel at once.
//!
//! Run: `cargo bench -p runwarden-benches --bench cross_node [-- --json] [--trials N]` (default
//! 100 trials per layout, half of them for the poll-only layout). PostgreSQL is the shared test server when
//! `RUNWARDEN_TEST_PG_URL` names one, else a cluster in a temporary directory
//! (`runwarden_testkit::TempCluster`), removed at the end.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_testkit::{Dist, Seen, TempCluster, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

const DEFAULT_TRIALS: usize = 100;
/// A bound on a step that should take milliseconds; it only fails a hung benchmark.
const WAIT: Duration = Duration::from_secs(20);
/// How often an in-flight call reads its run's row when nothing wakes it (R6).
const SIGNAL_READ_INTERVAL: Duration = Duration::from_secs(1);

/// One layout: where the store is, and whether the call runs in serve or in a worker.
struct Layout {
    name: &'static str,
    /// `None`: SQLite in the installation's data directory.
    store: Option<String>,
    /// The call runs in a separate `runwarden worker` process (serve has no slot).
    on_worker: bool,
    /// Trials, as a share of `--trials`.
    share: f64,
}

/// A child process killed (and reaped) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch installation on the layout's store with the MCP server imported as `srv`
/// and agent `a`, whose one tool call (`srv__create`) the server never answers.
struct Install {
    dir: tempfile::TempDir,
}

impl Install {
    fn new(mcp_url: &str, store: Option<&str>) -> Self {
        let install = Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        let mut init = install.command(&["init"]);
        if let Some(url) = store {
            init.env("RUNWARDEN_DATABASE_URL", url);
        }
        check(init.output().expect("the binary runs"), "init");
        let mut text = std::fs::read_to_string(install.config())
            .expect("init wrote the config")
            .replace("\nallow = []\n", "\nallow = [\"127.0.0.1\"]\n")
            // The reaper has nothing to find here; keep it out of the measurement.
            .replace("concurrency = 4\n", "concurrency = 4\nreap_seconds = 60\n");
        if let Some(url) = store {
            text = text.replace("\n[store]\n", &format!("\n[store]\nurl = \"{url}\"\n"));
        }
        text.push_str(&format!(
            "\n[mcp.servers.srv]\nurl = \"{mcp_url}\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n",
        ));
        std::fs::write(install.config(), text).expect("the config is writable");
        let plan =
            json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "never"}]);
        std::fs::write(install.path().join("plan.json"), plan.to_string())
            .expect("the plan is writable");
        install.ok(&["mcp", "import", "srv"]);
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

    fn ok(&self, args: &[&str]) -> String {
        check(
            self.command(args).output().expect("the binary runs"),
            args[0],
        )
    }

    /// `serve` on a free port with `slots` worker slots; the process and its URL.
    fn serve(&self, slots: usize) -> (Process, String) {
        let slots = slots.to_string();
        let mut child = self
            .command(&[
                "--json",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--concurrency",
                &slots,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let mut ready = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut ready)
            .expect("the ready line");
        let url = serde_json::from_str::<Value>(&ready).expect("the ready line is JSON")["url"]
            .as_str()
            .expect("the ready line names the url")
            .to_string();
        (Process(child), url)
    }

    /// `worker --concurrency 1`, its output discarded.
    fn worker(&self) -> Process {
        let child = self
            .command(&["--json", "worker", "--concurrency", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the worker starts");
        Process(child)
    }
}

fn check(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "runwarden {what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What one layout measured.
struct Figures {
    answered_to_close: Dist,
    sent_to_close: Dist,
    /// Runs not `cancelled` with their write fence kept (R11) at the end of a trial.
    mismatches: usize,
    took: Duration,
}

/// Runs `trials` cancels in one layout against the MCP server `mcp`.
fn measure(
    layout: &Layout,
    trials: usize,
    mcp: &mut TestServer,
    server_runtime: &tokio::runtime::Runtime,
    client_runtime: &tokio::runtime::Runtime,
) -> Figures {
    let started = Instant::now();
    let install = Install::new(&mcp.url("/mcp"), layout.store.as_deref());
    let token = serde_json::from_str::<Value>(
        &install.ok(&["--json", "token", "create", "--role", "operator"]),
    )
    .expect("token create is JSON")["token"]
        .as_str()
        .expect("a token")
        .to_string();
    let (_serve, url) = install.serve(if layout.on_worker { 0 } else { 4 });
    let _worker = layout.on_worker.then(|| install.worker());
    mcp.drain_requests();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    let (mut answered_to_close, mut sent_to_close) = (Vec::new(), Vec::new());
    let mut mismatches = 0;
    for _ in 0..trials {
        let run_id = client_runtime.block_on(async {
            let answer = http
                .post(format!("{url}/v1/runs"))
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .body(json!({"agent": "a", "prompt": "go", "mode": "queued"}).to_string())
                .send()
                .await
                .expect("serve answers");
            let run: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
            run["run_id"].as_str().expect("a run id").to_string()
        });
        // Until a worker (serve's or the worker process's) has the tool call on the wire.
        server_runtime.block_on(async {
            loop {
                let request = mcp.next_request(WAIT).await;
                if String::from_utf8_lossy(&request.body).contains("tools/call") {
                    break;
                }
            }
        });
        // A random phase against the call's own once-a-second read of its row (R6), which
        // is how a call in another process learns of the cancel when nothing wakes it: with
        // no offset every trial would cancel at the same phase and sample one point.
        if layout.on_worker {
            std::thread::sleep(random_below(SIGNAL_READ_INTERVAL));
        }
        let (sent, answered) = client_runtime.block_on(async {
            let sent = Instant::now();
            let answer = http
                .post(format!("{url}/v1/runs/{run_id}/cancel"))
                .bearer_auth(&token)
                .send()
                .await
                .expect("serve answers");
            let at = Instant::now();
            assert!(answer.status().is_success(), "the cancel was refused");
            (sent, at)
        });
        let closed = server_runtime.block_on(async {
            loop {
                if let Seen::Closed(at) = mcp.next(WAIT).await {
                    return at;
                }
            }
        });
        // On the same node the call may be woken before the answer is written: then the
        // first figure is 0.
        answered_to_close.push(closed.saturating_duration_since(answered));
        sent_to_close.push(closed.saturating_duration_since(sent));
        let status = client_runtime.block_on(async {
            let answer = http
                .get(format!("{url}/v1/runs/{run_id}"))
                .bearer_auth(&token)
                .send()
                .await
                .expect("serve answers");
            serde_json::from_slice::<Value>(&answer.bytes().await.unwrap()).unwrap()
        });
        if status["status"] != "cancelled" || status["pending_effect"] != "non_idempotent_write" {
            mismatches += 1;
        }
    }
    Figures {
        answered_to_close: Dist::new(answered_to_close),
        sent_to_close: Dist::new(sent_to_close),
        mismatches,
        took: started.elapsed(),
    }
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json_output = args.iter().any(|a| a == "--json");
    let trials = args
        .iter()
        .position(|a| a == "--trials")
        .and_then(|i| args.get(i + 1))
        .map(|n| n.parse().expect("--trials takes a number"))
        .unwrap_or(DEFAULT_TRIALS);
    // The MCP server runs on its own runtime so its close timestamps are not delayed.
    let server_runtime = common::one_thread_runtime();
    let client_runtime = common::one_thread_runtime();
    let mut mcp = server_runtime.block_on(TestServer::start(mcp_handler(
        vec![tool("create")],
        &["create"],
    )));
    let cluster = TempCluster::start();
    let (same_db, cross_db) = client_runtime.block_on(async {
        (
            cluster.fresh_database().await,
            cluster.fresh_database().await,
        )
    });
    let layouts = [
        Layout {
            name: "same node (woken), SQLite",
            store: None,
            on_worker: false,
            share: 1.0,
        },
        Layout {
            name: "same node (woken), PostgreSQL",
            store: Some(same_db),
            on_worker: false,
            share: 1.0,
        },
        Layout {
            name: "cross node: API on serve, call on a worker process, PostgreSQL",
            store: Some(cross_db),
            on_worker: true,
            share: 1.0,
        },
        Layout {
            name: "poll-only: API on serve, call on a worker process, SQLite",
            store: None,
            on_worker: true,
            // Its figure is the throttle's uniform phase; half the trials keep the whole
            // benchmark within a couple of minutes.
            share: 0.5,
        },
    ];
    if !json_output {
        println!("## Cancel through the API to the close seen by the MCP server\n");
        println!(
            "| layout | trials | answered -> close p50 ms | p99 ms | max ms | request sent -> close p50 ms | p99 ms | not cancelled with fence | wall s |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    }
    for layout in &layouts {
        let n = ((trials as f64 * layout.share).ceil() as usize).max(1);
        let figures = measure(layout, n, &mut mcp, &server_runtime, &client_runtime);
        let (a, s) = (&figures.answered_to_close, &figures.sent_to_close);
        if json_output {
            println!(
                "{}",
                json!({"bench": "cross_node", "layout": layout.name, "trials": n,
                       "answered_to_close_p50_ms": ms(a.pct(50.0)), "answered_to_close_p99_ms": ms(a.pct(99.0)),
                       "answered_to_close_max_ms": ms(a.max()),
                       "sent_to_close_p50_ms": ms(s.pct(50.0)), "sent_to_close_p99_ms": ms(s.pct(99.0)),
                       "mismatches": figures.mismatches, "wall_s": figures.took.as_secs_f64()})
            );
        } else {
            println!(
                "| {} | {n} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.1} |",
                layout.name,
                ms(a.pct(50.0)),
                ms(a.pct(99.0)),
                ms(a.max()),
                ms(s.pct(50.0)),
                ms(s.pct(99.0)),
                figures.mismatches,
                figures.took.as_secs_f64()
            );
        }
    }
    drop(cluster);
}
