//! The write fence's mark is on disk before the write may leave (R7). The mark is the last
//! thing written before the first byte of a non-idempotent call, so no later commit syncs
//! it; if its commit were not synced, a power cut could take the mark back and the reaper
//! would send the write again. What shows it is the system call: this test runs a child
//! process (this same test binary) under `strace` and checks that the WAL is synced
//! between the start and the end of the mark, and that under the operator's choice of
//! `Durability::ProcessCrash` it is not.

use std::path::Path;
use std::process::{Command, Stdio};

use runwarden_runtime::store::{FenceMark, Heartbeat, NewRunStatus, RunCreate, RunStore};
use runwarden_store_sqlite::Durability;
use serde_json::json;

use crate::common::TempDb;

/// Names the database the child marks; set only for the child.
const CHILD_DB: &str = "RUNWARDEN_FENCE_CHILD_DB";
/// Set for a child that opens its store with `Durability::ProcessCrash`.
const CHILD_PROCESS_CRASH: &str = "RUNWARDEN_FENCE_CHILD_PROCESS_CRASH";
/// Paths the child opens (and fails to open) around the mark, so the trace shows where
/// the mark begins and ends.
const BEGIN: &str = "/runwarden-fence-mark-begins";
const END: &str = "/runwarden-fence-mark-ends";

const T0: i64 = 1_700_000_000_000;
const OWNER: &str = "segment-a";

#[test]
fn the_fence_mark_is_synced_to_disk_before_it_answers() {
    let (between, wal) = trace_the_mark(Durability::PowerCut);
    assert!(
        syncs(&between, &wal),
        "the fence mark answered without syncing the WAL, so a power cut could take it back; \
         system calls between the marks:\n{}",
        between.join("\n")
    );
}

#[test]
fn under_process_crash_durability_the_fence_mark_is_not_synced() {
    // The operator's choice: the mark survives a killed process (it is committed to the
    // WAL in the page cache), not a power cut. The trace shows the sync really is skipped,
    // which is where the mode's speed comes from.
    let (between, wal) = trace_the_mark(Durability::ProcessCrash);
    assert!(
        !syncs(&between, &wal),
        "process_crash durability still synced the mark; system calls between the marks:\n{}",
        between.join("\n")
    );
    assert!(
        between
            .iter()
            .any(|l| l.contains("openat(") && l.contains(END)),
        "the trace reached the end of the mark: {between:#?}"
    );
}

/// Whether any of `lines` syncs the file `wal`.
fn syncs(lines: &[String], wal: &str) -> bool {
    lines
        .iter()
        .any(|l| (l.contains("fdatasync(") || l.contains("fsync(")) && l.contains(wal))
}

/// Makes a running run, then has a child process (this test binary) mark its fence with
/// the store opened under `durability`, under strace. Returns the system calls from the
/// mark's start to its end (both included) and the WAL's path.
fn trace_the_mark(durability: Durability) -> (Vec<String>, String) {
    if let Some(why) = strace_missing() {
        panic!("this test needs strace to watch the store's system calls: {why}");
    }
    let db = TempDb::new();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = db.open();
        store
            .run_create(RunCreate {
                id: "run-1".into(),
                agent: "helpdesk".into(),
                correlation: "run-1".into(),
                request: Some(json!({"input": "file a ticket"})),
                status: NewRunStatus::Running {
                    owner: OWNER.into(),
                    lease_until_ms: T0 + 30_000,
                },
                now_ms: T0,
                origin: Default::default(),
            })
            .await
            .expect("run_create");
    });

    let trace = db.path.with_extension("trace");
    let mut command = Command::new("strace");
    command
        .args([
            "-f",
            "-qq",
            "-y",
            "-e",
            "trace=openat,fsync,fdatasync",
            "-o",
        ])
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args([
            "fence_durable::child_marks_the_fence",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &db.path)
        .stdout(Stdio::null());
    if durability == Durability::ProcessCrash {
        command.env(CHILD_PROCESS_CRASH, "1");
    }
    let status = command.status().expect("strace starts");
    assert!(status.success(), "the child that marks the fence failed");

    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines.iter().position(|l| l.contains(BEGIN));
    let end = lines.iter().position(|l| l.contains(END));
    let (Some(begin), Some(end)) = (begin, end) else {
        panic!("the trace has no begin and end marks:\n{text}");
    };
    let between = lines[begin..=end].iter().map(|l| l.to_string()).collect();
    (between, format!("{}-wal", db.path.display()))
}

/// The child: marks the fence of the run its parent made. Ignored, so it runs only when
/// the parent asks for it by name.
#[test]
#[ignore = "run by the_fence_mark_is_synced_to_disk_before_it_answers under strace"]
fn child_marks_the_fence() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let durability = if std::env::var_os(CHILD_PROCESS_CRASH).is_some() {
            Durability::ProcessCrash
        } else {
            Durability::PowerCut
        };
        let store = runwarden_store_sqlite::SqliteStore::open(Path::new(&path))
            .unwrap()
            .with_durability(durability);
        // A write first (a lease renewal), so opening and starting the WAL, which syncs
        // whatever the setting, are behind us.
        let renewed = store
            .run_heartbeat(Heartbeat {
                id: "run-1".into(),
                owner: OWNER.into(),
                epoch: 1,
                lease_until_ms: T0 + 30_000,
                now_ms: T0 + 1,
            })
            .await
            .expect("run_heartbeat");
        assert!(renewed, "the run holds its lease");
        let _ = std::fs::File::open(BEGIN);
        let marked = store
            .run_fence_mark(FenceMark {
                id: "run-1".into(),
                owner: OWNER.into(),
                epoch: 1,
                effect: "non_idempotent_write".into(),
                lease_until_ms: T0 + 30_000,
                now_ms: T0 + 1,
            })
            .await
            .expect("run_fence_mark");
        let _ = std::fs::File::open(END);
        assert!(marked, "the run holds its lease, so the mark is made");
    });
}

/// Why strace cannot watch a child here, if it cannot.
fn strace_missing() -> Option<String> {
    match Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "strace cannot trace here ({}): run as root where ptrace is allowed",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!(
            "strace is not installed ({e}): apt-get install strace"
        )),
    }
}
