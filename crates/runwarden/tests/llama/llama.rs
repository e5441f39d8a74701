//! Tool-calling runs of the real binary against a real model server: llama.cpp's
//! `llama-server` with SmolLM2-135M on 127.0.0.1 (`runwarden_testkit::LlamaServer`, with
//! the repository's tool template), once per provider, with a real MCP server's tool.
//! Protocol behaviour only: a tool call reached the MCP server and the run completed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{LlamaServer, TestServer, mcp_handler, tool};
use serde_json::Value;

use crate::support::{Sandbox, runwarden};

/// A generous cap per model turn: enough for a tool call or a short answer, small enough
/// for 2 cores (issue 13: with no cap the server generates until the timeout).
const MAX_TOKENS: u32 = 128;

/// An initialised sandbox admitting 127.0.0.1, with MCP server `srv` (its tools imported)
/// and agent `a` on `provider` at the llama-server, offered `srv__*`.
async fn sandbox(
    mcp: &TestServer,
    llama: &LlamaServer,
    provider: &str,
    extra: &str,
) -> Arc<Sandbox> {
    sandbox_with(mcp, llama, provider, MAX_TOKENS, extra).await
}

/// [`sandbox`] with another `max_tokens` per model turn.
async fn sandbox_with(
    mcp: &TestServer,
    llama: &LlamaServer,
    provider: &str,
    max_tokens: u32,
    extra: &str,
) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\n\n[agents.a]\nprovider = \"{provider}\"\nmodel = \"smollm2-135m\"\nbase_url = \"{}\"\nmax_tokens = {max_tokens}\ntools = [\"srv__*\"]\n{extra}\n",
        mcp.url("/mcp"),
        llama.base_url(),
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    sandbox
}

/// Runs agent `a`, expects completed, and checks the model's tool call reached the MCP
/// server as a `tools/call` of `create`.
async fn tool_calling_run_completes(sandbox: &Arc<Sandbox>, mcp: &mut TestServer) {
    mcp.drain_requests();
    let out = runwarden(
        sandbox,
        &["run", "--agent", "a", "Create a ticket titled printer."],
    )
    .await
    .ok()
    .says("completed");
    assert!(
        out.stdout.contains("model asked for srv__create"),
        "the model called the tool: {out:#?}"
    );
    let calls: Vec<Value> = mcp
        .drain_requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert!(
        !calls.is_empty(),
        "a tools/call reached the MCP server: {out:#?}"
    );
    assert_eq!(calls[0]["params"]["name"], "create");
    assert!(calls[0]["params"]["arguments"].is_object(), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_run_completes_against_a_real_model_server_through_openai() {
    let llama = LlamaServer::start();
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = sandbox(&mcp, &llama, "openai", "").await;
    tool_calling_run_completes(&sandbox, &mut mcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_run_completes_against_a_real_model_server_through_anthropic() {
    let llama = LlamaServer::start();
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    // L1: a server that wants no key gets none; no api_key_secret is configured.
    let sandbox = sandbox(&mcp, &llama, "anthropic", "").await;
    tool_calling_run_completes(&sandbox, &mut mcp).await;
}

/// How long the server's log may take to show a task starting or stopping (slow CI).
const LOG_WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_budget_tears_down_a_real_models_stream_and_the_server_stops_generating() {
    // The generation runs to its 1,500-token cap whatever the model would have said: only
    // the budget can end it early.
    let llama = LlamaServer::start_with(&["--ignore-eos"]);
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    // R13: four seconds for the whole run (room for a loaded machine to start generating),
    // and a turn that would take far longer.
    let sandbox = sandbox_with(&mcp, &llama, "openai", 1500, "max_wall_seconds = 4").await;
    let mark = llama.log_mark();
    let started = Instant::now();
    let (out, generation) = tokio::join!(
        runwarden(
            &sandbox,
            &[
                "run",
                "--agent",
                "a",
                "Count from 1 to 1000, one number per line."
            ],
        ),
        llama.wait_generation_started(mark, LOG_WAIT)
    );
    let took = started.elapsed();
    let out = out.fails().says("BUDGET_EXCEEDED: max_wall_seconds = 4");
    let (task, _) = generation.expect("the server started generating");
    let stopped = llama
        .wait_generation_stopped(mark, task, LOG_WAIT)
        .await
        .expect("the server stopped the generation");
    println!(
        "run took {took:?}; the server stopped generating {:?} after the run ended",
        stopped.saturating_duration_since(started + took)
    );
    assert!(
        llama.cancelled_since(mark, task),
        "the server cancelled the task because the stream was torn down, it did not finish it: {}",
        llama.log_text()
    );
    // L6: a stream of seconds shows its progress as it goes.
    assert!(
        out.stdout.contains("model streaming: "),
        "progress events were printed while the model streamed: {out:#?}"
    );
    // A generous bound (10x the budget) against a run that waited for the model's end.
    assert!(took < Duration::from_secs(40), "the run took {took:?}");
}
