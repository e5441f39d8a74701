//! The store backend as operators choose it and what one process opens of it: `[store] url`
//! and `$RUNWARDEN_DATABASE_URL`, the one writer `serve` holds on SQLite, and
//! `events --follow` seeing another process's writes. A PostgreSQL database shared by a
//! server and a worker process is in the `postgres` target.

use std::time::{Duration, Instant};

use runwarden_runtime::RunState;
use runwarden_runtime::queue::{Claim, QueueStore};
use runwarden_runtime::store::{EventAppend, RunSettle, RunStore};
use runwarden_store_sqlite::SqliteStore;
use serde_json::{Value, json};

use crate::support::serve::Serve;
use crate::support::{Live, SIGIL, Sandbox};

/// Generous: the cross-process look runs every 250 ms; only a missing resync fails it.
const CROSS_PROCESS: Duration = Duration::from_secs(5);

/// A sandbox with the scripted agent `a`, so runs can be enqueued.
fn with_agent() -> Sandbox {
    let sandbox = Sandbox::initialised();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    sandbox
}

#[test]
fn the_database_url_in_the_environment_overrides_the_file() {
    let sandbox = Sandbox::initialised();
    let elsewhere = sandbox.path().join("elsewhere.db");
    let mut command = sandbox.command(&["status", "no-such-run"]);
    command.env(
        "RUNWARDEN_DATABASE_URL",
        format!("sqlite:{}", elsewhere.display()),
    );
    sandbox
        .run_command(command)
        .fails()
        .says(&format!("no database at {}", elsewhere.display()));
    let mut command = sandbox.command(&["status", "no-such-run"]);
    command.env(
        "RUNWARDEN_DATABASE_URL",
        format!("sqlite://{}", sandbox.database().display()),
    );
    sandbox
        .run_command(command)
        .fails()
        .says("no run with id no-such-run");
}

#[test]
fn a_store_url_in_the_file_selects_the_database_relative_to_the_file() {
    let sandbox = Sandbox::initialised();
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    std::fs::write(
        sandbox.config(),
        text.replace(
            "[store]\n",
            "[store]\nurl = \"sqlite:.runwarden/runwarden.db\"\n",
        ),
    )
    .unwrap();
    sandbox.run(&["token", "list"]).ok();
    std::fs::write(
        sandbox.config(),
        text.replace("[store]\n", "[store]\nurl = \"sqlite:other.db\"\n"),
    )
    .unwrap();
    sandbox.run(&["token", "list"]).fails().says(&format!(
        "no database at {}",
        sandbox.path().join("other.db").display()
    ));
}

#[test]
fn bad_store_urls_are_refused_saying_what_to_write() {
    let sandbox = Sandbox::initialised();
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    for (url, says) in [
        (
            "mysql://rw@db/runwarden",
            "scheme \"mysql\" are not supported",
        ),
        ("runwarden.db", "write sqlite:runwarden.db"),
        ("sqlite::memory:", "in-memory"),
        ("", "the store URL is empty"),
    ] {
        std::fs::write(
            sandbox.config(),
            text.replace("[store]\n", &format!("[store]\nurl = \"{url}\"\n")),
        )
        .unwrap();
        sandbox
            .run(&["token", "list"])
            .fails()
            .says("in [store] url")
            .says(says)
            .says("write");
    }
    std::fs::write(
        sandbox.config(),
        text.replace(
            "[store]\n",
            "[store]\nurl = \"sqlite:a.db\"\nsqlite_path = \"b.db\"\n",
        ),
    )
    .unwrap();
    sandbox
        .run(&["token", "list"])
        .fails()
        .says("has both url and sqlite_path");
}

#[test]
fn a_postgres_url_that_fails_is_named_without_its_password() {
    let sandbox = Sandbox::initialised();
    for (url, says) in [
        (
            format!("postgres://rw:{SIGIL}@127.0.0.1:1/runwarden"),
            "could not be reached",
        ),
        (format!("postgres://rw:{SIGIL}@/runwarden"), "names no host"),
        (
            format!("postgresql://rw:{SIGIL}@[::1/runwarden"),
            "not valid",
        ),
    ] {
        for args in [
            &["status", "some-run"][..],
            &["--json", "status", "some-run"],
            &["worker"],
            &["serve", "--listen", "127.0.0.1:0"],
            &["audit", "verify"],
        ] {
            let mut command = sandbox.command(args);
            command
                .env("RUNWARDEN_DATABASE_URL", &url)
                .env("RUNWARDEN_LOG", "trace");
            let output = sandbox.run_command(command).fails().says(says);
            assert!(!output.all().contains(SIGIL), "{args:?}: {output:#?}");
        }
    }
}

/// `(read-write, read-only)` descriptors process `pid` holds on `file`, from /proc.
fn descriptors_on(pid: u32, file: &std::path::Path) -> (usize, usize) {
    let (mut rw, mut ro) = (0, 0);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(file) {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ))
        .unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        match flags & 0o3 {
            0o2 => rw += 1,
            0o0 => ro += 1,
            other => panic!("unexpected access mode {other:o}"),
        }
    }
    (rw, ro)
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_opens_one_store_with_one_writer_for_the_api_and_its_workers() {
    let sandbox = Sandbox::initialised();
    let serve = Serve::start(&sandbox, 2).await;
    let database = std::fs::canonicalize(sandbox.database()).unwrap();
    // One SQLite store: its write connection, and three read-only ones: the status probe
    // (R6), the reads a call makes on its own thread, and the reads over whole tables (a
    // metrics scrape's counts). Before the composition root, `serve` held three stores:
    // three writers and three probes.
    assert_eq!(descriptors_on(serve.pid(), &database), (1, 3));
}

#[tokio::test(flavor = "multi_thread")]
async fn events_follow_sees_what_another_process_appends_through_a_resync() {
    let sandbox = with_agent();
    let run: Value = sandbox
        .run(&["--json", "enqueue", "--agent", "a", "go"])
        .ok()
        .json();
    let run_id = run["run_id"].as_str().unwrap().to_string();
    // This test process is the other process: it claims the run and writes its events.
    let store = SqliteStore::open_existing(sandbox.database()).unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let claim = Claim {
        owner: "elsewhere".into(),
        lease_until_ms: now + 60_000,
        now_ms: now,
        agents: None,
        start: false,
    };
    let epoch = store
        .run_claim(claim)
        .await
        .unwrap()
        .expect("the run is claimed")
        .claim_epoch;
    let append = |kind: &str, payload: Value| EventAppend {
        id: run_id.clone(),
        owner: "elsewhere".into(),
        epoch,
        kind: kind.into(),
        payload,
        clear_fence: false,
        round: None,
        end: None,
        now_ms: chrono::Utc::now().timestamp_millis(),
        before: None,
    };
    store
        .run_event_append(append("run_started", json!({"agent": "a"})))
        .await
        .unwrap();
    let mut follow = Live::start(&sandbox, &["--json", "events", &run_id, "--follow"]);
    // The first event comes from follow's first read; after it, only the feed can bring more.
    assert_eq!(follow.json().await["seq"], 1);
    let appended = Instant::now();
    store
        .run_event_append(append(
            "model_response",
            json!({"round": 1, "text": "done"}),
        ))
        .await
        .unwrap();
    let second = follow.json().await;
    let took = appended.elapsed();
    assert_eq!(second["kind"], "model_response", "{second}");
    eprintln!("another process's append reached events --follow after {took:?}");
    assert!(took < CROSS_PROCESS, "{took:?}");
    store
        .run_event_append(append("run_completed", json!({"reason": "done"})))
        .await
        .unwrap();
    store
        .run_settle(RunSettle {
            id: run_id.clone(),
            owner: "elsewhere".into(),
            epoch,
            status: RunState::Completed,
            reason: "done".into(),
            now_ms: chrono::Utc::now().timestamp_millis(),
        })
        .await
        .unwrap();
    let ended = follow.ended(appended, CROSS_PROCESS * 2).await;
    assert_eq!(ended.code, Some(0), "{ended:#?}");
    assert!(
        ended.stdout.iter().any(|l| l.contains("run_completed")),
        "{ended:#?}"
    );
}
