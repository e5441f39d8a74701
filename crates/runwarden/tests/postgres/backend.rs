//! A PostgreSQL database shared by a server and a worker process, as operators choose it
//! with `[store] url`.

use std::time::Instant;

use serde_json::Value;

use crate::support::serve::Serve;
use crate::support::{Live, Sandbox};

#[tokio::test(flavor = "multi_thread")]
async fn a_server_and_a_worker_process_share_one_postgres_database() {
    let cluster = runwarden_testkit::TempCluster::start();
    let url = cluster.fresh_database().await;
    let sandbox = Sandbox::empty();
    std::fs::write(
        sandbox.config(),
        format!(
            "[store]\nurl = \"{url}\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n"
        ),
    )
    .unwrap();
    std::fs::write(sandbox.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    sandbox.run(&["init"]).ok();
    assert!(
        !sandbox.database().exists(),
        "no SQLite file with a PostgreSQL url"
    );
    let token = sandbox
        .run(&["--json", "token", "create", "--role", "viewer"])
        .ok()
        .json()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let serve = Serve::start(&sandbox, 0).await; // the API alone
    let mut worker = Live::start(&sandbox, &["--json", "worker", "--concurrency", "1"]);
    let run: Value = sandbox
        .run(&["--json", "enqueue", "--agent", "a", "go"])
        .ok()
        .json();
    let enqueued = Instant::now();
    let run_id = run["run_id"].as_str().unwrap().to_string();
    // The worker process claims it: woken by the enqueue's NOTIFY (its backstop is 1 s).
    let done = worker.json().await;
    eprintln!(
        "enqueued to completed in another process: {:?}",
        enqueued.elapsed()
    );
    assert_eq!(done["run_id"], run_id.as_str(), "{done}");
    assert_eq!(done["outcome"], "completed", "{done}");
    // The server reads what the worker wrote, from the same database.
    let mut events = sandbox.command(&["--json", "events", &run_id]);
    events
        .env("RUNWARDEN_SERVER", serve.url())
        .env("RUNWARDEN_TOKEN", &token);
    let kinds: Vec<String> = sandbox
        .run_command(events)
        .ok()
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds, ["run_started", "model_response", "run_completed"]);
    sandbox.run(&["audit", "verify"]).ok().says("intact");
}
