//! A secret put by one process is searched for by another that is already running: a
//! worker finishes a run (so its matcher over the secrets is built), `runwarden secret put`
//! stores a new secret from a process of its own, and the worker's next run, whose tool
//! call carries that value, is refused before a byte is sent. The fast target runs it on
//! SQLite, the `postgres` target on PostgreSQL.

use runwarden_testkit::{HttpRequest, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use super::{Live, Sandbox};

/// Stored by the second process only after the worker's matcher was built.
const LATE: &str = "late-secret-6b0e2f9c/ok";

fn calls(server: &mut TestServer) -> usize {
    server
        .drain_requests()
        .iter()
        .filter(|r: &&HttpRequest| {
            serde_json::from_slice::<Value>(&r.body).unwrap_or(Value::Null)["method"]
                == "tools/call"
        })
        .count()
}

pub(crate) async fn a_running_worker_refuses_a_secret_put_by_another_process(sandbox: Sandbox) {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    sandbox.allow_loopback();
    let call = |title: &str| json!([{"tool_calls": [{"name": "srv__create", "arguments": {"q": title}}]}, {"text": "done"}]);
    for (agent, plan) in [("warm", call("hello")), ("leak", call(LATE))] {
        sandbox.add_scripted_agent(agent, &plan, "srv__*");
    }
    sandbox.append_config(&format!(
        "[mcp.servers.srv]\nurl = \"{}\"\n",
        mcp.url("/mcp")
    ));
    sandbox.run(&["mcp", "import", "srv"]).ok();
    mcp.drain_requests();

    let mut worker = Live::start(&sandbox, &["--json", "worker", "--concurrency", "1"]);
    sandbox.run(&["enqueue", "--agent", "warm", "go"]).ok();
    let done = worker.json().await;
    assert_eq!(done["outcome"], "completed", "{done}");
    assert_eq!(calls(&mut mcp), 1, "the warm-up call went out");

    // Another process, while the worker runs.
    sandbox.put("late", LATE);

    let run: Value = sandbox
        .run(&["--json", "enqueue", "--agent", "leak", "go"])
        .ok()
        .json();
    let run_id = run["run_id"].as_str().unwrap();
    let done = worker.json().await;
    assert_eq!(done["run_id"], run_id, "{done}");
    assert_eq!(
        calls(&mut mcp),
        0,
        "the call carrying the new secret went out"
    );
    let events = sandbox.run(&["--json", "events", run_id]).ok();
    let refused = events
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["kind"] == "tool_executed")
        .unwrap_or_else(|| panic!("no tool step: {events:#?}"));
    let text = refused["payload"]["text"].as_str().unwrap_or_default();
    assert_eq!(refused["payload"]["outcome"], "refused", "{refused}");
    assert!(
        text.contains("(secret_exfiltration)") && text.contains("secret \"late\""),
        "{text}"
    );
    assert!(!events.all().contains(LATE), "{events:#?}");
}
