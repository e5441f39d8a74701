//! Storage faults where they happen: a real `runwarden worker` whose SQLite writes fail at
//! the operating-system level (`strace --inject` on `pwrite64`, `fdatasync` and `fsync`
//! of the database and its WAL, at the Nth call and in windows switched on and off while
//! runs are in flight), and a real 16 MiB tmpfs filled to the last byte, then freed.
//!
//! Every run calls one non-idempotent write on a server that counts them. After each case:
//! the server saw each run's write at most once, a run reported or stored completed has its
//! write step and its end in the log, the worker never printed two endings for one run, the
//! row's status matches the log's final event, the ended runs' counts kept for metrics
//! match the rows, `audit verify` passes, and once the fault is removed every run ends
//! within [`SETTLE_BOUND`] without a restart.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fault_checks::{
    SETTLE_BOUND, Seen, check_case, report, until_all_ended, until_stderr,
};
use crate::support::workers::{WORKER_SETTINGS, enqueue, install_in, write_agents};
use crate::support::{Live as Child, Sandbox};

/// Runs per case; each makes one non-idempotent write.
const RUNS: usize = 8;

/// How a fault is switched on and off.
#[derive(Debug, Clone, Copy)]
enum Schedule {
    /// From the Nth matching call of each thread on, for `hold`.
    Nth { n: u32, hold: Duration },
    /// On for `on`, off for `off`, for `total`.
    Windows {
        on: Duration,
        off: Duration,
        total: Duration,
    },
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    syscall: &'static str,
    errno: &'static str,
    schedule: Schedule,
}

impl Fault {
    fn name(&self) -> String {
        match self.schedule {
            Schedule::Nth { n, hold } => {
                format!("{} {} from call {n} for {hold:?}", self.syscall, self.errno)
            }
            Schedule::Windows { on, off, total } => format!(
                "{} {} on {on:?} / off {off:?} for {total:?}",
                self.syscall, self.errno
            ),
        }
    }
}

/// `strace` attached to every thread of `pid`, failing `fault` on the database's files
/// until dropped (which detaches it and leaves the worker running).
struct Injector {
    strace: std::process::Child,
}

impl Injector {
    fn attach(pid: u32, database: &Path, fault: &Fault, when: &str) -> Self {
        let wal = PathBuf::from(format!("{}-wal", database.display()));
        let strace = Command::new("strace")
            .args(["-f", "-qq", "-o", "/dev/null", "-p", &pid.to_string()])
            .arg("-P")
            .arg(database)
            .arg("-P")
            .arg(&wal)
            .arg(format!(
                "--inject={}:error={}:when={when}",
                fault.syscall, fault.errno
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("strace starts");
        Self { strace }
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        // SIGINT detaches strace from its tracees, which go on running.
        let _ = Command::new("kill")
            .args(["-INT", &self.strace.id().to_string()])
            .status();
        let _ = self.strace.wait();
    }
}

/// Why this machine cannot run the strace cases, if it cannot.
fn strace_missing() -> Option<String> {
    let probe = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "--inject=pwrite64:error=EIO:when=1",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match probe {
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

/// Applies `fault` to the worker `pid` as its schedule says; returns when it is removed.
async fn inject(pid: u32, database: &Path, fault: Fault) {
    match fault.schedule {
        Schedule::Nth { n, hold } => {
            let injector = Injector::attach(pid, database, &fault, &format!("{n}+"));
            tokio::time::sleep(hold).await;
            drop(injector);
        }
        Schedule::Windows { on, off, total } => {
            let until = Instant::now() + total;
            while Instant::now() < until {
                let injector = Injector::attach(pid, database, &fault, "1+");
                tokio::time::sleep(on).await;
                drop(injector);
                tokio::time::sleep(off).await;
            }
        }
    }
}

/// Waits (reading the file every 20 ms, up to 10 s) until a worker has written its
/// presence row.
async fn until_a_worker_is_seen(database: &Path) {
    let started = Instant::now();
    loop {
        let conn = rusqlite::Connection::open_with_flags(
            database,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("the database opens read-only");
        let seen: i64 = conn
            .query_row("SELECT COUNT(*) FROM workers", [], |r| r.get(0))
            .unwrap_or(0);
        if seen > 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the worker never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One case: `RUNS` queued runs, a worker, the fault applied by `apply` while the runs are
/// in flight, then the checks.
async fn case<F, Fut>(sandbox: Sandbox, apply: F) -> Seen
where
    F: FnOnce(u32, PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let agents = write_agents("w", "answer", RUNS);
    let install = install_in(sandbox, WORKER_SETTINGS, &agents).await;
    let mut ids = Vec::new();
    for (k, (agent, _)) in agents.iter().enumerate() {
        let q = format!("answer {k}");
        ids.push((enqueue(&install.sandbox, agent, &q).await, q));
    }
    let mut worker = {
        let mut command = install
            .sandbox
            .command(&["--json", "worker", "--concurrency", "4"]);
        // The reaper's lines, and every change of the store's state.
        let log = "warn,runwarden_runtime::worker=info,runwarden_runtime::store_state=info";
        command.env("RUNWARDEN_LOG", log);
        Child::spawn(command)
    };
    apply(worker.pid, install.sandbox.database()).await;
    let settled = until_all_ended(&install.sandbox.database(), SETTLE_BOUND).await;
    let stopping = Instant::now();
    let died = worker.reaped.load(std::sync::atomic::Ordering::SeqCst);
    if !died {
        worker.signal("TERM");
    }
    let ended = worker.ended(stopping, Duration::from_secs(30)).await;
    let mut seen = check_case(&install, &ids, &ended.stdout, settled).await;
    if died {
        seen.violations.push(format!(
            "the worker exited during the fault (code {:?}): {:#?} {:#?}",
            ended.code, ended.stdout, ended.stderr
        ));
    }
    seen.complaints = ended
        .stderr
        .iter()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .count();
    seen.state_changes = ended
        .stderr
        .into_iter()
        .filter(|l| l.contains("the store is failing") || l.contains("accepts writes again"))
        .collect();
    seen
}

/// Checks that the store's state changes were each logged once: failing and recovered
/// alternate (a state is never reported twice in a row), the fault was reported, and the
/// last change is the recovery.
fn check_state_changes(seen: &Seen) -> Result<usize, String> {
    let failing: Vec<bool> = seen
        .state_changes
        .iter()
        .map(|l| l.contains("the store is failing"))
        .collect();
    let alternate = failing.windows(2).all(|w| w[0] != w[1] || w[0]);
    if failing.first() != Some(&true) || failing.last() != Some(&false) || !alternate {
        return Err(format!(
            "the store's state changes were not each logged once: {:#?}",
            seen.state_changes
        ));
    }
    Ok(failing.iter().filter(|f| **f).count())
}

fn faults() -> Vec<Fault> {
    let mut faults = Vec::new();
    let hold = Duration::from_millis(1500);
    for errno in ["EIO", "EROFS", "ENOSPC"] {
        for n in [1, 4] {
            faults.push(Fault {
                syscall: "pwrite64",
                errno,
                schedule: Schedule::Nth { n, hold },
            });
        }
        faults.push(Fault {
            syscall: "pwrite64",
            errno,
            schedule: Schedule::Windows {
                on: Duration::from_millis(400),
                off: Duration::from_millis(50),
                total: Duration::from_secs(3),
            },
        });
    }
    for syscall in ["fdatasync", "fsync"] {
        faults.push(Fault {
            syscall,
            errno: "EIO",
            schedule: Schedule::Windows {
                on: Duration::from_millis(400),
                off: Duration::from_millis(50),
                total: Duration::from_secs(2),
            },
        });
    }
    faults
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_disk_writes_fail_makes_each_write_at_most_once_and_every_run_ends() {
    if let Some(why) = strace_missing() {
        panic!("this test needs strace to fail the store's system calls: {why}");
    }
    let started = Instant::now();
    let (mut cases, mut runs, mut writes, mut violations) = (0, 0, 0, Vec::new());
    let mut felt = 0;
    for fault in faults() {
        let seen = case(Sandbox::initialised(), |pid, database| async move {
            inject(pid, &database, fault).await;
        })
        .await;
        report(&fault.name(), &seen);
        if !seen.state_changes.is_empty()
            && let Err(e) = check_state_changes(&seen)
        {
            violations.push(format!("{}: {e}", fault.name()));
        }
        cases += 1;
        runs += seen.runs;
        writes += seen.writes;
        felt += usize::from(seen.complaints > 0);
        violations.extend(
            seen.violations
                .into_iter()
                .map(|v| format!("{}: {v}", fault.name())),
        );
    }
    println!(
        "{cases} strace cases, {runs} runs, {writes} writes seen by the server, {} violations, in {:.1?}",
        violations.len(),
        started.elapsed()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    // The faults bit: a suite whose injections missed the database would prove nothing.
    assert!(
        felt * 2 > cases,
        "the worker logged store faults in only {felt} of {cases} cases"
    );
}

/// A tmpfs of 16 MiB mounted for one test, unmounted on drop.
struct SmallDisk {
    mount: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> Result<Self, String> {
        let mount = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
            .arg(mount.path())
            .output()
            .map_err(|e| format!("mount does not run: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self { mount })
    }

    /// Writes a file until the file system refuses a single byte more.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.mount.path().join("filler");
        let mut file = std::fs::File::create(&filler).expect("the filler file");
        for chunk in [1 << 16, 4096, 1] {
            let block = vec![0u8; chunk];
            while file.write_all(&block).is_ok() {}
        }
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mount.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_a_disk_filled_to_the_last_byte_and_freed_makes_each_write_at_most_once() {
    let disk = SmallDisk::mount().unwrap_or_else(|why| {
        panic!("this test needs to mount a tmpfs, which takes root ({why}): run it as root")
    });
    let sandbox = Sandbox::initialised_in(disk.mount.path());
    let disk = Arc::new(disk);
    let full = disk.clone();
    let seen = case(sandbox, |_pid, database| async move {
        // Filled once the worker is up (its presence row is written before its first
        // claim), so the runs are in flight when the disk fills.
        until_a_worker_is_seen(&database).await;
        let filler = full.fill();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        std::fs::remove_file(filler).expect("the filler goes");
    })
    .await;
    report("tmpfs of 16 MiB filled to the last byte, then freed", &seen);
    let changes = check_state_changes(&seen).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "the store's state: {changes} failing, {} lines in all",
        seen.state_changes.len()
    );
    println!(
        "1 full-disk case, {} runs, {} writes seen",
        seen.runs, seen.writes
    );
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
}

/// How many of `lines` say the disk is full.
fn full_disk_warnings(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("the disk is full"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_on_a_full_disk_waits_not_ready_and_works_once_space_is_freed() {
    let disk = SmallDisk::mount().unwrap_or_else(|why| {
        panic!("this test needs to mount a tmpfs, which takes root ({why}): run it as root")
    });
    let agents = write_agents("w", "answer", RUNS);
    let install = install_in(
        Sandbox::initialised_in(disk.mount.path()),
        WORKER_SETTINGS,
        &agents,
    )
    .await;
    let mut ids = Vec::new();
    for (k, (agent, _)) in agents.iter().enumerate() {
        let q = format!("answer {k}");
        ids.push((enqueue(&install.sandbox, agent, &q).await, q));
    }
    let database = install.sandbox.database();
    let filler = disk.fill();
    // Both started on the full disk: a worker, and a server (its API alone) for /readyz.
    let mut worker = {
        let mut command = install
            .sandbox
            .command(&["--json", "worker", "--concurrency", "4"]);
        command.env("RUNWARDEN_LOG", "warn");
        Child::spawn(command)
    };
    let mut serve = Child::start(
        &install.sandbox,
        &[
            "--json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--concurrency",
            "0",
        ],
    );
    let path = database.display().to_string();
    let mut worker_lines = until_stderr(&mut worker, &["WARN", "the disk is full", &path]).await;
    let url = serve.json().await["url"].as_str().unwrap().to_string();
    let mut serve_lines = until_stderr(&mut serve, &["WARN", "the disk is full", &path]).await;
    let answer = reqwest::get(format!("{url}/readyz")).await.unwrap();
    assert_eq!(answer.status(), 503, "not ready while the disk is full");
    let body: Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "not_ready", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk_full"),
        "{body}"
    );
    let api = reqwest::get(format!("{url}/v1/runs")).await.unwrap();
    assert_eq!(api.status(), 503, "the API is unavailable, not broken");
    assert!(api.headers().contains_key("retry-after"), "{api:?}");
    let body: Value = serde_json::from_str(&api.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    let health = reqwest::get(format!("{url}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200, "the process itself answers");
    assert!(!worker.has_exited(), "the worker waits instead of exiting");
    assert_eq!(
        install.calls.total("create"),
        0,
        "nothing ran on a full disk"
    );

    let freed = Instant::now();
    std::fs::remove_file(filler).expect("the filler goes");
    let settled = until_all_ended(&database, SETTLE_BOUND).await;
    let ready = reqwest::get(format!("{url}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200, "ready once there is room");
    for child in [&mut worker, &mut serve] {
        child.signal("TERM");
    }
    let ended = worker.ended(Instant::now(), Duration::from_secs(30)).await;
    assert_eq!(ended.code, Some(0), "{ended:#?}");
    worker_lines.extend(ended.stderr);
    let served = serve.ended(Instant::now(), Duration::from_secs(30)).await;
    assert_eq!(served.code, Some(0), "{served:#?}");
    serve_lines.extend(served.stderr);
    assert_eq!(
        full_disk_warnings(&worker_lines),
        1,
        "said once: {worker_lines:#?}"
    );
    assert_eq!(
        full_disk_warnings(&serve_lines),
        1,
        "said once: {serve_lines:#?}"
    );
    let seen = check_case(&install, &ids, &ended.stdout, settled).await;
    report("worker started on a full disk, then freed", &seen);
    println!(
        "1 started-full case, {} runs, {} writes seen, all ended {:.1?} after space was freed",
        seen.runs,
        seen.writes,
        freed.elapsed()
    );
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    assert_eq!(
        seen.writes, RUNS,
        "every run wrote once after the space came back"
    );
}
