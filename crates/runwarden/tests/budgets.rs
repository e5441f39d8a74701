//! R13 and L5 at the operator surfaces: a run request may only lower its agent's budgets
//! (API and CLI), a lower one is stored and enforced, and usage is shown.

use runwarden_testkit::{TestServer, mcp_handler, tool};
use serde_json::json;

use crate::support::runwarden;
use crate::support::serve::{Api, Serve, install, token};

const TWO_CALLS: &str = r#"[{"tool_calls": [
    {"name": "srv__create", "arguments": {}},
    {"name": "srv__create", "arguments": {}}
]}, {"text": "filed"}]"#;

/// Agent `a` allows two tool calls per run.
async fn sandbox(mcp: &TestServer) -> std::sync::Arc<crate::support::Sandbox> {
    let sandbox = install(mcp, serde_json::from_str(TWO_CALLS).unwrap()).await;
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    let text = text.replacen(
        "tools = [\"srv__*\"]\n",
        "tools = [\"srv__*\"]\nmax_tool_calls = 2\n",
        1,
    );
    std::fs::write(sandbox.config(), text).unwrap();
    sandbox
}

fn tools_calls(mcp: &mut TestServer) -> usize {
    mcp.drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count()
}

#[tokio::test]
async fn the_api_refuses_a_budget_above_the_agents_and_enforces_a_lower_one() {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = sandbox(&mcp).await;
    let operator = token(&sandbox, "operator").await;
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);
    let op = Some(operator.as_str());

    let above = json!({"agent": "a", "prompt": "go", "max_tool_calls": 3}).to_string();
    let (status, body) = api.call("POST", "/v1/runs", op, Some(above)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("max_tool_calls = 3") && message.contains("may only lower"),
        "{body}"
    );

    let lower =
        json!({"agent": "a", "prompt": "go", "mode": "sync", "max_tool_calls": 1}).to_string();
    let (status, run) = api.call("POST", "/v1/runs", op, Some(lower)).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["status"], "failed", "{run}");
    let reason = run["termination_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("BUDGET_EXCEEDED: max_tool_calls = 1"),
        "{reason}"
    );
    assert_eq!(run["usage"], json!({"input_tokens": 0, "output_tokens": 0}));
    assert_eq!(tools_calls(&mut mcp), 1, "the second call was never sent");
}

#[tokio::test]
async fn the_cli_refuses_a_budget_above_the_agents_and_prints_what_ran_out_and_the_usage() {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = sandbox(&mcp).await;
    runwarden(
        &sandbox,
        &["run", "--agent", "a", "--max-tool-calls", "5", "go"],
    )
    .await
    .fails()
    .says("may only lower");
    runwarden(
        &sandbox,
        &["enqueue", "--agent", "a", "--max-tool-calls", "9", "go"],
    )
    .await
    .fails()
    .says("max_tool_calls = 9");
    assert_eq!(tools_calls(&mut mcp), 0);

    let out = runwarden(
        &sandbox,
        &["run", "--agent", "a", "--max-tool-calls", "1", "go"],
    )
    .await
    .fails()
    .says("BUDGET_EXCEEDED: max_tool_calls = 1")
    .says("(0 input, 0 output tokens)");
    assert_eq!(tools_calls(&mut mcp), 1);
    let run_id = out
        .all()
        .lines()
        .find_map(|l| l.strip_prefix("run ").and_then(|r| r.split(' ').next()))
        .unwrap()
        .to_string();
    let status = runwarden(&sandbox, &["--json", "status", &run_id])
        .await
        .ok()
        .json();
    assert_eq!(
        status["usage"],
        json!({"input_tokens": 0, "output_tokens": 0})
    );
}
