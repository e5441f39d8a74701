//! A tool imported by one process reaches a worker that is already running: the worker
//! keeps the catalogue it read while the catalogue's version stands, so this shows that
//! an import from another process moves the version and the worker reads the catalogue
//! again. The fast target runs it on SQLite, the `postgres` target on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use runwarden_testkit::{HttpRequest, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use super::{Live, Sandbox};

pub(crate) async fn a_running_worker_binds_a_tool_imported_by_another_process(sandbox: Sandbox) {
    // The server offers `later` only once the test says so.
    let offers_later = Arc::new(AtomicBool::new(false));
    let mcp = TestServer::start({
        let offers_later = offers_later.clone();
        let before = mcp_handler(vec![tool("first")], &[]);
        let after = mcp_handler(vec![tool("first"), tool("later")], &[]);
        move |request: &HttpRequest| {
            if offers_later.load(Ordering::SeqCst) {
                after(request)
            } else {
                before(request)
            }
        }
    })
    .await;
    sandbox.allow_loopback();
    let plans = [("warm", "srv__first"), ("late", "srv__later")];
    for (agent, tool) in plans {
        let plan =
            json!([{"tool_calls": [{"name": tool, "arguments": {"q": "x"}}]}, {"text": "done"}]);
        sandbox.add_scripted_agent(agent, &plan, tool);
    }
    sandbox.append_config(&format!(
        "[mcp.servers.srv]\nurl = \"{}\"\n",
        mcp.url("/mcp")
    ));
    sandbox.run(&["mcp", "import", "srv"]).ok();

    // The worker binds a run's tools from the catalogue it has read.
    let mut worker = Live::start(&sandbox, &["--json", "worker", "--concurrency", "1"]);
    sandbox.run(&["enqueue", "--agent", "warm", "go"]).ok();
    let done = worker.json().await;
    assert_eq!(done["outcome"], "completed", "{done}");

    // Another process imports the new tool while the worker runs.
    offers_later.store(true, Ordering::SeqCst);
    sandbox.run(&["mcp", "import", "srv"]).ok();

    let run: Value = sandbox
        .run(&["--json", "enqueue", "--agent", "late", "go"])
        .ok()
        .json();
    let done = worker.json().await;
    assert_eq!(done["run_id"], run["run_id"], "{done}");
    assert_eq!(
        done["outcome"], "completed",
        "the run bound the tool imported after the worker started: {done}"
    );
}
