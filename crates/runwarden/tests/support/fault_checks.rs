//! What a test checks once a storage fault is removed: every run ended within a bound, the
//! server saw each write at most once, each row matches its log, the worker printed one
//! ending per run, the ended runs' counts match the rows, and `audit verify` passes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::workers::Install;
use super::{Live as Child, runwarden};

/// Once the fault is removed, every run ends within this (leases are 1 s, the reaper looks
/// every 0.2 s, a retry waits at most a few seconds).
pub(crate) const SETTLE_BOUND: Duration = Duration::from_secs(40);

/// The worker endings that end a run (the others hand it on).
const ENDINGS: [&str; 4] = ["completed", "failed", "dead_lettered", "cancelled"];

/// What one case saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) runs: usize,
    pub(crate) writes: usize,
    pub(crate) written_twice: usize,
    pub(crate) statuses: BTreeMap<String, usize>,
    pub(crate) settled_in: Duration,
    /// Warnings and errors the worker logged: the fault was felt.
    pub(crate) complaints: usize,
    /// The worker's lines that report a change of the store's state.
    pub(crate) state_changes: Vec<String>,
    pub(crate) violations: Vec<String>,
}

/// One run's row status and event kinds, read from the database file.
fn read_run(database: &Path, id: &str) -> (String, Vec<String>) {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("the database opens read-only");
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let status: String = conn
        .query_row("SELECT status FROM runs WHERE id = ?1", [id], |r| r.get(0))
        .expect("the run exists");
    let mut stmt = conn
        .prepare("SELECT kind FROM run_events WHERE run_id = ?1 ORDER BY seq")
        .unwrap();
    let kinds = stmt
        .query_map([id], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    (status, kinds)
}

/// The ended runs' counts the store keeps (for metrics) against the rows, counted one by
/// one: each change of a run's state and its count commit together or not at all.
pub(crate) fn ended_counts_match_rows(database: &Path) -> Result<(), String> {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("the database opens read-only");
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let read = |sql: &str| -> BTreeMap<String, i64> {
        conn.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let kept = read("SELECT status, n FROM run_counts WHERE n <> 0");
    let rows = read(
        "SELECT status, COUNT(*) FROM runs WHERE status IN ('completed', 'failed', 'cancelled')
         GROUP BY status",
    );
    if kept == rows {
        Ok(())
    } else {
        Err(format!(
            "the ended runs' counts {kept:?} differ from the rows {rows:?}"
        ))
    }
}

/// Waits (reading the file every 100 ms, up to `bound`) until no run is queued, running or
/// parked; answers how long that took, or `None` if the bound passed.
pub(crate) async fn until_all_ended(database: &Path, bound: Duration) -> Option<Duration> {
    let started = Instant::now();
    loop {
        let open = {
            let conn = rusqlite::Connection::open_with_flags(
                database,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .expect("the database opens read-only");
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            conn.query_row(
                "SELECT COUNT(*) FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled')",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_or(1)
        };
        if open == 0 {
            return Some(started.elapsed());
        }
        if started.elapsed() > bound {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks one case's runs after the fault was removed, the worker's output lines included.
pub(crate) async fn check_case(
    install: &Install,
    ids: &[(String, String)],
    worker_lines: &[String],
    settled: Option<Duration>,
) -> Seen {
    let database = install.sandbox.database();
    let mut seen = Seen {
        runs: ids.len(),
        settled_in: settled.unwrap_or(SETTLE_BOUND),
        ..Seen::default()
    };
    if settled.is_none() {
        seen.violations.push(format!(
            "some runs had not ended {SETTLE_BOUND:?} after the fault was removed"
        ));
    }
    let endings: Vec<Value> = worker_lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["outcome"].as_str().is_some_and(|o| ENDINGS.contains(&o)))
        .collect();
    for (id, q) in ids {
        let writes = install.calls.of("create", q);
        seen.writes += writes;
        if writes > 1 {
            seen.written_twice += 1;
            seen.violations
                .push(format!("run {id}: the server saw its write {writes} times"));
        }
        let (status, kinds) = read_run(&database, id);
        *seen.statuses.entry(status.clone()).or_default() += 1;
        let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
        match runwarden_runtime::RunState::parse(&status) {
            Some(state) => {
                if let Err(e) = runwarden_runtime::check_row_matches_log(id, state, &kinds) {
                    seen.violations.push(e);
                }
            }
            None => seen
                .violations
                .push(format!("run {id}: unknown status {status}")),
        }
        if status == "completed" && (!kinds.contains(&"tool_executed") || writes != 1) {
            seen.violations.push(format!(
                "run {id}: completed with {writes} writes seen and the log {kinds:?}"
            ));
        }
        let mine: Vec<&str> = endings
            .iter()
            .filter(|v| v["run_id"] == id.as_str())
            .filter_map(|v| v["outcome"].as_str())
            .collect();
        if mine.len() > 1 {
            seen.violations
                .push(format!("run {id}: the worker printed {mine:?} for one run"));
        }
        if mine.contains(&"completed") && status != "completed" {
            seen.violations.push(format!(
                "run {id}: the worker printed completed, the row says {status}"
            ));
        }
    }
    if let Err(e) = ended_counts_match_rows(&database) {
        seen.violations.push(e);
    }
    let verify = runwarden(&install.sandbox, &["audit", "verify"]).await;
    if verify.code != Some(0) {
        seen.violations
            .push(format!("audit verify failed: {}", verify.all().trim()));
    }
    seen
}

pub(crate) fn report(name: &str, seen: &Seen) {
    println!(
        "{name}: {} runs, {} writes seen, {} written more than once, rows {:?}, all ended {:.1?} after the fault, {} worker warnings, {} changes of the store's state",
        seen.runs,
        seen.writes,
        seen.written_twice,
        seen.statuses,
        seen.settled_in,
        seen.complaints,
        seen.state_changes.len()
    );
    for v in &seen.violations {
        println!("  VIOLATION {v}");
    }
}

/// Reads `child`'s stderr until a line holding every one of `needles`; answers the lines
/// read, that one last.
pub(crate) async fn until_stderr(child: &mut Child, needles: &[&str]) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), child.stderr.recv()).await;
        let Ok(Some(line)) = next else {
            panic!("no stderr line with {needles:?}; it printed: {lines:#?}");
        };
        let found = needles.iter().all(|n| line.contains(n));
        lines.push(line);
        if found {
            return lines;
        }
    }
}
