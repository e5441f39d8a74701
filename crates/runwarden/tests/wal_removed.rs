//! The write-ahead log deleted under a running `serve` (API and workers), as an operator's
//! `rm` or a cleanup job would: the process says once, at ERROR, which file disappeared
//! and to restart it; `/readyz` fails; it claims nothing more; after a restart every run,
//! those finished before the `rm` and those queued after it, has written exactly once and
//! its row matches its log.

use std::time::{Duration, Instant};

use crate::support::fault_checks::{
    SETTLE_BOUND, check_case, report, until_all_ended, until_stderr,
};
use crate::support::workers::{WORKER_SETTINGS, enqueue, install_in, write_agents};
use crate::support::{Live as Child, Sandbox};

/// Runs finished before the `rm`, and runs queued after it.
const BEFORE: usize = 4;
const AFTER: usize = 2;

/// `args` with the log at WARN (ERROR included) on stderr.
fn start(sandbox: &Sandbox, args: &[&str]) -> Child {
    let mut command = sandbox.command(args);
    command.env("RUNWARDEN_LOG", "warn");
    Child::spawn(command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_deleted_under_a_running_worker_stops_its_claims_and_no_run_is_written_twice() {
    let agents = write_agents("w", "answer", BEFORE + AFTER);
    let install = install_in(Sandbox::initialised(), WORKER_SETTINGS, &agents).await;
    let database = install.sandbox.database();
    let wal = format!("{}-wal", database.display());
    let mut serve = start(
        &install.sandbox,
        &[
            "--json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--concurrency",
            "2",
        ],
    );
    let url = serve.json().await["url"].as_str().unwrap().to_string();
    let mut ids = Vec::new();
    for (k, (agent, _)) in agents.iter().enumerate().take(BEFORE) {
        let q = format!("answer {k}");
        ids.push((enqueue(&install.sandbox, agent, &q).await, q));
    }
    assert!(
        until_all_ended(&database, SETTLE_BOUND).await.is_some(),
        "the first runs end"
    );

    std::fs::remove_file(&wal).expect("the log is there to delete");
    let answer = reqwest::get(format!("{url}/readyz")).await.unwrap();
    assert_eq!(answer.status(), 503, "not ready once the log is gone");
    let mut said = until_stderr(&mut serve, &["ERROR", &wal, "start it again"]).await;
    for (k, (agent, _)) in agents.iter().enumerate().skip(BEFORE) {
        let q = format!("answer {k}");
        ids.push((enqueue(&install.sandbox, agent, &q).await, q));
    }
    // Its next claim is refused (the enqueue above wakes it); nothing new was sent.
    said.extend(until_stderr(&mut serve, &["WARN", "could not claim", &wal]).await);
    assert_eq!(install.calls.total("create"), BEFORE, "no run after the rm");
    let answer = reqwest::get(format!("{url}/readyz")).await.unwrap();
    assert_eq!(answer.status(), 503, "still not ready");

    let stopping = Instant::now();
    serve.signal("TERM");
    let ended = serve.ended(stopping, Duration::from_secs(30)).await;
    said.extend(ended.stderr);
    let errors = said
        .iter()
        .filter(|l| l.contains("ERROR") && l.contains("was deleted"))
        .count();
    assert_eq!(errors, 1, "said once: {said:#?}");

    // Restarted, as the message says: the runs queued after the rm are worked, and the
    // ones finished before it are not worked again.
    let mut worker = start(
        &install.sandbox,
        &["--json", "worker", "--concurrency", "2"],
    );
    let settled = until_all_ended(&database, SETTLE_BOUND).await;
    let stopping = Instant::now();
    worker.signal("TERM");
    let ended = worker.ended(stopping, Duration::from_secs(30)).await;
    let seen = check_case(&install, &ids, &ended.stdout, settled).await;
    report("the WAL deleted under serve, then a restart", &seen);
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    assert_eq!(seen.writes, BEFORE + AFTER, "each run wrote once: {seen:?}");
}
