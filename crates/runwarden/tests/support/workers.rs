//! Workers as separate processes on one store, as a test drives them: short leases, a
//! counting MCP server, installations of scripted agents, and the CLI's answers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use super::Live as Child;
use super::{Ended, Sandbox, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// Short leases so a dead worker's run is recoverable within about a second.
pub(crate) const WORKER_SETTINGS: &str = "lease_seconds = 1.0\nheartbeat_seconds = 0.3\nreap_seconds = 0.2\nretry_base_seconds = 0.05\ngrace_seconds = 20\n";
/// The sandbox's configuration with the template's lease and heartbeat lines replaced by
/// [`WORKER_SETTINGS`], ready for more sections to be appended.
pub(crate) fn config_with_short_leases(sandbox: &Sandbox) -> String {
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    for template_line in ["lease_seconds = 30 ", "heartbeat_seconds = 10 "] {
        let line = text
            .lines()
            .find(|l| l.starts_with(template_line))
            .unwrap_or_else(|| panic!("the template changed:\n{text}"))
            .to_string();
        text = text.replace(&format!("{line}\n"), "");
    }
    text.replace("\n[worker]\n", &format!("\n[worker]\n{WORKER_SETTINGS}"))
}

/// Makes each worker log what its reaper did, so a test can wait for that line, and
/// its warnings, as at the default level.
const REAPER_LOG: &str = "warn,runwarden_runtime::worker=info";

/// The `tools/call` requests the server received, by `"<tool> <q argument>"`, and, for a
/// `create` whose argument starts with `answer`, the database lock the server took before
/// answering it (so the worker cannot record the answer).
#[derive(Clone, Default)]
pub(crate) struct Calls(
    Arc<Mutex<BTreeMap<String, usize>>>,
    pub(crate) Arc<Mutex<Option<LockHold>>>,
);

/// The database to lock, and the connection holding its write lock once taken.
pub(crate) type LockHold = (PathBuf, Option<rusqlite::Connection>);

impl Calls {
    pub(crate) fn of(&self, tool: &str, q: &str) -> usize {
        let calls = self.0.lock().expect("not poisoned");
        calls.get(&format!("{tool} {q}")).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self, tool: &str) -> usize {
        let calls = self.0.lock().expect("not poisoned");
        let prefix = format!("{tool} ");
        calls
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

/// An MCP server with three tools that counts every `tools/call` before it answers:
/// `create` (a non-idempotent write) never answers, so a call to it is in flight until the
/// client goes away, except `create({"q": "answer..."})`, which answers (after taking the
/// SQLite database's write lock when [`Calls`] names a database to lock); `search` (read-only) stalls on its first call for each argument and
/// answers the later ones; `lookup` (read-only) answers at once.
fn counting_server(calls: Calls) -> impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static {
    let answer = mcp_handler(vec![tool("create"), tool("search"), tool("lookup")], &[]);
    move |request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call" {
            let name = body["params"]["name"].as_str().unwrap_or_default();
            let q = body["params"]["arguments"]["q"]
                .as_str()
                .unwrap_or_default();
            let seen = {
                let mut calls = calls.0.lock().expect("not poisoned");
                let count = calls.entry(format!("{name} {q}")).or_default();
                *count += 1;
                *count
            };
            if name == "create" && q.starts_with("answer") {
                let mut hold = calls.1.lock().expect("not poisoned");
                if let Some((database, held)) = hold.as_mut() {
                    let lock = rusqlite::Connection::open(&*database).expect("the database");
                    lock.execute_batch("BEGIN EXCLUSIVE")
                        .expect("the write lock");
                    *held = Some(lock);
                }
            } else if name == "create" || (name == "search" && seen == 1) {
                return HttpReply::Stall;
            }
        }
        answer(request)
    }
}

/// One installation: a sandbox whose agents use the counting server `srv`.
pub(crate) struct Install {
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) server: TestServer,
    pub(crate) calls: Calls,
}

/// A plan with one tool call `srv__<tool>({"q": q})`, then a final answer.
pub(crate) fn call_then_answer(tool: &str, q: &str) -> Value {
    json!([
        {"tool_calls": [{"name": format!("srv__{tool}"), "arguments": {"q": q}}]},
        {"text": "done"}
    ])
}

/// `n` agents `<name>K`, each calling `create({"q": "<q> K"})` once, so the server counts
/// per run.
pub(crate) fn write_agents(name: &str, q: &str, n: usize) -> Vec<(String, Value)> {
    (0..n)
        .map(|k| {
            (
                format!("{name}{k}"),
                call_then_answer("create", &format!("{q} {k}")),
            )
        })
        .collect()
}

/// A plan that answers at once, with no tool.
fn answer_at_once() -> Value {
    json!([{"text": "done"}])
}

/// An initialised `sandbox` (whichever store it names) with the `[worker]` settings
/// `worker_settings` in place of the template's lease and heartbeat, the counting server
/// imported as `srv` (`search` and `lookup` declared read-only), agent `quick` answering
/// at once, and one scripted agent per `(name, plan)`.
pub(crate) async fn install_in(
    sandbox: Sandbox,
    worker_settings: &str,
    agents: &[(String, Value)],
) -> Install {
    let calls = Calls::default();
    let mut server = TestServer::start(counting_server(calls.clone())).await;
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    for template_line in ["lease_seconds = 30 ", "heartbeat_seconds = 10 "] {
        let line = text
            .lines()
            .find(|l| l.starts_with(template_line))
            .unwrap_or_else(|| panic!("the template changed:\n{text}"))
            .to_string();
        text = text.replace(&format!("{line}\n"), "");
    }
    assert!(
        text.contains("\n[worker]\n"),
        "the template changed:\n{text}"
    );
    text = text.replace("\n[worker]\n", &format!("\n[worker]\n{worker_settings}"));
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[mcp.servers.srv.tools.search]\neffect = \"read_only\"\n\n[mcp.servers.srv.tools.lookup]\neffect = \"read_only\"\n",
        server.url("/mcp")
    ));
    let quick = ("quick".to_string(), answer_at_once());
    for (name, plan) in agents.iter().chain([&quick]) {
        text.push_str(&format!(
            "\n[agents.{name}]\nprovider = \"scripted\"\nscript = \"{name}.json\"\ntools = [\"srv__*\"]\n"
        ));
        std::fs::write(
            sandbox.path().join(format!("{name}.json")),
            plan.to_string(),
        )
        .unwrap();
    }
    std::fs::write(sandbox.config(), text).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    server.drain_requests();
    Install {
        sandbox,
        server,
        calls,
    }
}

/// `enqueue`; the run id it printed.
pub(crate) async fn enqueue(sandbox: &Arc<Sandbox>, agent: &str, prompt: &str) -> String {
    let out = runwarden(sandbox, &["enqueue", "--agent", agent, prompt])
        .await
        .ok();
    let id = out.stdout.trim().to_string();
    assert_eq!(id.len(), 36, "enqueue prints the run id: {out:#?}");
    id
}

/// `status --json`.
pub(crate) async fn status(sandbox: &Arc<Sandbox>, id: &str) -> Value {
    runwarden(sandbox, &["--json", "status", id])
        .await
        .ok()
        .json()
}

/// `events --json`, one object per line.
pub(crate) async fn events(sandbox: &Arc<Sandbox>, id: &str) -> Vec<Value> {
    runwarden(sandbox, &["--json", "events", id])
        .await
        .ok()
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

pub(crate) fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

/// Waits until the wall clock is past the lease expiry `status` reported. The reaper
/// compares `lease_expires < now`, so a few milliseconds past it the run is stale.
pub(crate) async fn past_lease_expiry(status: &Value) {
    let text = status["lease_expires"]
        .as_str()
        .unwrap_or_else(|| panic!("a running run has a lease: {status:#}"));
    let expires = chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("lease_expires is RFC 3339 ({e}): {text}"));
    let left = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    assert!(left < WAIT, "a lease of 1 s expires soon, not in {left:?}");
    tokio::time::sleep(left + Duration::from_millis(20)).await;
}

/// Waits until the server holds the `tools/call` of `tool` with argument `q`.
pub(crate) async fn until_call_is_held(server: &mut TestServer, tool: &str, q: &str) {
    loop {
        let request = server.next_request(WAIT).await;
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call"
            && body["params"]["name"] == tool
            && body["params"]["arguments"]["q"] == q
        {
            return;
        }
    }
}

impl Child {
    /// `runwarden --json worker [--concurrency N]`, its reaper logging what it recovers.
    pub(crate) fn worker(sandbox: &Sandbox, concurrency: Option<usize>) -> Self {
        let concurrency = concurrency.map(|n| n.to_string());
        let mut args = vec!["--json", "worker"];
        if let Some(n) = &concurrency {
            args.extend(["--concurrency", n]);
        }
        let mut command = sandbox.command(&args);
        command.env("RUNWARDEN_LOG", REAPER_LOG);
        Self::spawn(command)
    }

    /// Reads outcome lines until the one for `run_id`; returns it and the lines before it.
    pub(crate) async fn outcome_of(&mut self, run_id: &str) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let line = self.json().await;
            if line["run_id"] == run_id {
                return (line, before);
            }
            before.push(line);
        }
    }

    /// Reads stderr until a line containing every one of `needles`.
    pub(crate) async fn until_stderr(&mut self, needles: &[&str]) -> String {
        loop {
            let line = tokio::time::timeout(WAIT, self.stderr.recv())
                .await
                .unwrap_or_else(|_| panic!("a line on stderr with {needles:?} in time"))
                .expect("stderr ended early");
            if needles.iter().all(|n| line.contains(n)) {
                return line;
            }
        }
    }

    /// SIGTERM on a worker with nothing running: it exits at once, successfully.
    pub(crate) async fn stop_idle(&mut self) -> Ended {
        let since = Instant::now();
        self.signal("TERM");
        let ended = self.ended(since, Duration::from_secs(2)).await;
        assert_eq!(ended.code, Some(0), "{ended:#?}");
        ended
    }
}

/// The worker's closing summary, the last stdout line of `--json worker`.
pub(crate) fn summary(ended: &Ended) -> Value {
    let last = ended.stdout.last().unwrap_or_else(|| panic!("{ended:#?}"));
    let summary: Value = serde_json::from_str(last).unwrap();
    assert_eq!(summary["stopped"], true, "{ended:#?}");
    summary
}
