//! M10 (amended): a tool's effect is resolved from `runwarden.toml` each time a run binds
//! its tools, not copied at `mcp import`; a declaration for a tool the server does not
//! offer is a configuration error naming both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpRequest, TestServer, mcp_handler, tool};
use serde_json::Value;

use crate::support::{Live, Sandbox, call_the_stalling_tool, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);
/// A cancel from another process reaches the held call by polling the row (R6).
const CROSS_PROCESS: Duration = Duration::from_secs(5);

/// Server `srv` at `server` offering `stall` (it never answers a call) and `create`, its
/// tools imported under the default effect, and agent `a` calling `srv__stall`.
async fn imported(server: &TestServer) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n",
        server.url("/mcp")
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(
        sandbox.path().join("plan.json"),
        call_the_stalling_tool().to_string(),
    )
    .unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    sandbox
}

/// Appends to the configuration after the import.
fn declare(sandbox: &Sandbox, toml: &str) {
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(toml);
    std::fs::write(sandbox.config(), text).unwrap();
}

/// The effect `mcp list --json` shows for `srv__stall`.
async fn listed_effect(sandbox: &Arc<Sandbox>) -> String {
    let listed = runwarden(sandbox, &["--json", "mcp", "list"])
        .await
        .ok()
        .json();
    let tools = listed[0]["tools"].as_array().unwrap();
    let stall = tools.iter().find(|t| t["remote_name"] == "stall").unwrap();
    stall["effect"].as_str().unwrap().to_string()
}

fn is_call(request: &HttpRequest) -> bool {
    serde_json::from_slice::<Value>(&request.body).unwrap_or(Value::Null)["method"] == "tools/call"
}

/// Starts a run, waits until its `tools/call` is held at the server, and answers the
/// run's `pending_effect` at that moment (the write fence, R7); then cancels the run.
async fn fence_while_the_call_is_held(sandbox: &Arc<Sandbox>, server: &mut TestServer) -> Value {
    let mut run = Live::start(sandbox, &["--json", "run", "--agent", "a", "go"]);
    let started = run.json().await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    while !is_call(&server.next_request(WAIT).await) {}
    let status = runwarden(sandbox, &["--json", "status", &run_id])
        .await
        .ok()
        .json();
    runwarden(sandbox, &["cancel", &run_id]).await.ok();
    let cancelled = Instant::now();
    server.next_close(CROSS_PROCESS).await;
    assert_eq!(run.ended(cancelled, CROSS_PROCESS).await.code, Some(130));
    status["pending_effect"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_changed_in_the_file_after_import_decides_the_next_run_and_mcp_list() {
    let mut server =
        TestServer::start(mcp_handler(vec![tool("stall"), tool("create")], &["stall"])).await;
    let sandbox = imported(&server).await;
    assert_eq!(listed_effect(&sandbox).await, "non_idempotent_write");

    // Declared read-only after the import: no re-import, and the next run does not fence.
    declare(
        &sandbox,
        "\n[mcp.servers.srv.tools.stall]\neffect = \"read_only\"\n",
    );
    assert_eq!(listed_effect(&sandbox).await, "read_only");
    assert_eq!(
        fence_while_the_call_is_held(&sandbox, &mut server).await,
        Value::Null,
        "a read-only call is not fenced"
    );

    // Declared a write again (at the server level, the tool's line changed): it fences.
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    let text = text.replace(
        "[mcp.servers.srv.tools.stall]\neffect = \"read_only\"",
        "[mcp.servers.srv.tools.stall]\neffect = \"idempotent_write\"",
    );
    std::fs::write(sandbox.config(), text).unwrap();
    assert_eq!(listed_effect(&sandbox).await, "idempotent_write");
    assert_eq!(
        fence_while_the_call_is_held(&sandbox, &mut server).await,
        "idempotent_write",
        "R7: the write is fenced with the effect the file declares now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_for_a_tool_the_server_does_not_offer_is_an_error_naming_server_and_tool() {
    let mut server =
        TestServer::start(mcp_handler(vec![tool("stall"), tool("create")], &["stall"])).await;
    let sandbox = imported(&server).await;
    declare(
        &sandbox,
        "\n[mcp.servers.srv.tools.creat]\neffect = \"read_only\"\n",
    );
    let named = "server srv offers no such tool";
    let tool = "tool \"creat\"";

    // Binding: the run is refused before it starts, and nothing reaches the server.
    server.drain_requests();
    runwarden(&sandbox, &["run", "--agent", "a", "go"])
        .await
        .fails()
        .says(named)
        .says(tool);
    assert!(server.drain_requests().iter().all(|r| !is_call(r)));

    // Listing: the list is shown, with the names the server offers, and the command fails.
    runwarden(&sandbox, &["mcp", "list"])
        .await
        .fails()
        .says("srv__create")
        .says(named)
        .says(tool)
        .says("it offers: create, stall");

    // Importing: refused before anything is stored.
    runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .fails()
        .says(named)
        .says(tool);
}
