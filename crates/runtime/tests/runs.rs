//! R2, R7, R8: full runs, the write fence, fail-closed recording of write steps.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_models::{
    ModelError, ModelProvider, ModelRequest, ModelTurn, OpenAiCompatible, ToolCallRequest,
};
use runwarden_runtime::{Outcome, RunState, RunStore};
use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use runwarden_vault::CancellationSignal;
use serde_json::{Value, json};

use crate::support::fixture;

fn tool_calls(server: &mut TestServer) -> usize {
    server
        .drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count()
}

#[tokio::test]
async fn a_scripted_run_calls_a_real_mcp_tool_and_completes_with_every_step_in_order() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]}, {"text": "filed it"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f
        .executor
        .create_sync("helper", "file a ticket")
        .await
        .unwrap();
    assert_eq!(
        run.status,
        RunState::Running,
        "a synchronous run is claimed at birth"
    );
    assert_eq!(run.claimed_by.as_deref(), Some(f.executor.owner()));

    let outcome = f
        .executor
        .execute(&run, &agent, "file a ticket", None)
        .await;
    assert_eq!(outcome, Outcome::Completed);
    assert_eq!(
        f.kinds(&run.id).await,
        [
            "run_started",
            "model_response",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(events[2].payload["outcome"], "succeeded");
    assert_eq!(events[2].payload["remote"], "create");
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.rounds, row.pending_effect),
        (RunState::Completed, 2, None),
        "the fence was cleared"
    );
    assert_eq!(row.termination_reason.as_deref(), Some("filed it"));
    assert_eq!(tool_calls(&mut server), 1);
}

/// An OpenAI-compatible model: a tool call first, then a final answer once it has read
/// the tool's result.
fn openai_model(request: &HttpRequest) -> HttpReply {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let answered = body["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
    let message = if answered {
        json!({"role": "assistant", "content": "ticket filed"})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "srv__create", "arguments": "{\"q\":\"printer\"}"}}]})
    };
    HttpReply::typed(
        200,
        "application/json",
        json!({"choices": [{"message": message, "finish_reason": "stop"}]}).to_string(),
    )
}

#[tokio::test]
async fn a_run_on_an_openai_compatible_model_offers_the_tools_and_completes() {
    let f = fixture().await;
    let mut model = TestServer::start(openai_model).await;
    let tools_server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let provider = Arc::new(OpenAiCompatible::new(
        f.egress.clone(),
        model.url("/v1"),
        "test-model",
    ));
    let agent = f.agent_with(
        provider,
        vec![f.tool(&tools_server.url("/mcp"), "create", Effect::ReadOnly)],
    );
    let run = f
        .executor
        .create_sync("helper", "file a ticket")
        .await
        .unwrap();
    assert_eq!(
        f.executor
            .execute(&run, &agent, "file a ticket", None)
            .await,
        Outcome::Completed
    );
    let first: Value =
        serde_json::from_slice(&model.next_request(crate::support::WAIT).await.body).unwrap();
    assert_eq!(
        first["tools"][0]["function"]["name"], "srv__create",
        "the local name is what the model sees"
    );
    let correlations: Vec<Option<String>> = f
        .vault
        .audit_list(Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.event.correlation)
        .collect();
    assert!(
        correlations
            .iter()
            .all(|c| c.as_deref() == Some(run.id.as_str())),
        "every outbound call carries the run id"
    );
}

/// A model that moves the run away from this segment while it "thinks", as a reaper
/// would, then asks for a write (or, with `answers`, gives its final answer).
struct Usurper {
    db: std::path::PathBuf,
    run_id: std::sync::Mutex<String>,
    answers: bool,
}

#[async_trait]
impl ModelProvider for Usurper {
    async fn complete(
        &self,
        _: &ModelRequest,
        _: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        let id = self.run_id.lock().unwrap().clone();
        let conn = rusqlite::Connection::open(&self.db).unwrap();
        conn.execute(
            "UPDATE runs SET claimed_by = 'another-worker' WHERE id = ?1",
            [id],
        )
        .unwrap();
        if self.answers {
            return Ok(crate::support::final_turn("done"));
        }
        Ok(ModelTurn {
            text: None,
            tool_calls: vec![ToolCallRequest {
                id: "c1".into(),
                name: "srv__create".into(),
                arguments: json!({}),
                invalid_arguments: None,
            }],
            finish: None,
            usage: None,
        })
    }
}

#[tokio::test]
async fn a_write_without_the_lease_never_reaches_the_server() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let usurper = Arc::new(Usurper {
        db: f.dir.path().join("runwarden.db"),
        run_id: std::sync::Mutex::new(run.id.clone()),
        answers: false,
    });
    let agent = f.agent_with(
        usurper,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::LeaseLost
    );
    assert_eq!(
        server.connection_count(),
        0,
        "the write was refused before the call"
    );
    assert_eq!(
        f.kinds(&run.id).await,
        ["run_started"],
        "a lost segment appends nothing more"
    );
}

#[tokio::test]
async fn a_final_answer_without_the_lease_neither_completes_the_run_nor_stores_the_answer() {
    let f = fixture().await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let usurper = Arc::new(Usurper {
        db: f.dir.path().join("runwarden.db"),
        run_id: std::sync::Mutex::new(run.id.clone()),
        answers: true,
    });
    let agent = f.agent_with(usurper, vec![]);
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::LeaseLost
    );
    // The answer and the run's end are one guarded write; the step alone is refused too.
    assert_eq!(f.kinds(&run.id).await, ["run_started"]);
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Running);
}

#[tokio::test]
async fn a_segment_without_a_persisted_run_writes_nothing() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let mut ghost = f.executor.create_sync("helper", "go").await.unwrap();
    ghost.id = "01900000-0000-7000-8000-000000000000".into();
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    assert_eq!(
        f.executor.execute(&ghost, &agent, "go", None).await,
        Outcome::LeaseLost
    );
    assert_eq!(server.connection_count(), 0);
}

#[tokio::test]
async fn a_write_whose_step_cannot_be_stored_fails_the_run_and_is_not_retried() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    f.store.fail_tool_steps.store(true, Ordering::SeqCst);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed);
    assert!(
        row.termination_reason
            .unwrap()
            .contains("a write step could not be recorded")
    );
    assert_eq!(
        row.pending_effect.as_deref(),
        Some("non_idempotent_write"),
        "the fence stays: nobody may retry it"
    );
    assert_eq!(tool_calls(&mut server), 1, "called once, never again");
}

#[tokio::test]
async fn a_read_only_step_that_cannot_be_stored_does_not_stop_the_run() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("search")], &[])).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__search", "arguments": {}}]}, {"text": "found"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "search", Effect::ReadOnly)],
    );
    f.store.fail_tool_steps.store(true, Ordering::SeqCst);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
}

#[tokio::test]
async fn an_unknown_tool_is_a_failed_result_the_model_reads_not_a_call() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("search")], &[])).await;
    let plan = json!([{"tool_calls": [{"name": "srv__delete_everything", "arguments": {}}]}, {"text": "sorry"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "search", Effect::ReadOnly)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    assert_eq!(events[2].payload["outcome"], "refused");
    assert_eq!(server.connection_count(), 0);
}

#[tokio::test]
async fn a_run_without_a_final_answer_stops_at_its_round_limit() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("search")], &[])).await;
    let turn = json!({"tool_calls": [{"name": "srv__search", "arguments": {}}]});
    let mut agent = f.agent(
        json!([turn, turn, turn, turn]),
        vec![f.tool(&server.url("/mcp"), "search", Effect::ReadOnly)],
    );
    agent.max_rounds = 3;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.rounds, 3);
    assert!(row.termination_reason.unwrap().contains("within 3 rounds"));
}

#[tokio::test]
async fn a_resumed_run_never_repeats_a_recorded_write_and_finishes_what_was_not_recorded() {
    let f = fixture().await;
    let mut server =
        TestServer::start(mcp_handler(vec![tool("create"), tool("search")], &[])).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    // An earlier segment asked for a write and a read, recorded the write, then died.
    f.prior(
        &run.id,
        &[(
            "run_started",
            json!({"agent": "helper", "prompt": "go", "owner": "test-earlier"}),
        )],
    )
    .await;
    let calls = json!([{"id": "call-1-1", "name": "srv__create", "arguments": {}}, {"id": "call-1-2", "name": "srv__search", "arguments": {}}]);
    f.prior(
        &run.id,
        &[(
            "model_response",
            json!({"round": 1, "text": null, "tool_calls": calls}),
        )],
    )
    .await;
    let recorded = json!({"round": 1, "call_id": "call-1-1", "tool": "srv__create", "outcome": "succeeded", "text": "ticket-1"});
    f.prior(&run.id, &[("tool_executed", recorded)]).await;

    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}, {"name": "srv__search", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![
            f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite),
            f.tool(&server.url("/mcp"), "search", Effect::ReadOnly),
        ],
    );
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let wire: Vec<String> = server
        .drain_requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter(|m| m["method"] == "tools/call")
        .map(|m| m["params"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        wire,
        ["search"],
        "only the unrecorded read ran again; the recorded write did not"
    );
    assert_eq!(
        f.kinds(&run.id).await,
        [
            "run_started",
            "model_response",
            "tool_executed",
            "run_resumed",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
}

/// A stateless MCP server whose `search` answers only `structuredContent`, `{"hits": N}`,
/// with N a string when the query is "bad" (off the schema the catalogue holds).
fn structured_server(request: &HttpRequest) -> HttpReply {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let method = body["method"].as_str().unwrap_or_default();
    if method.starts_with("notifications/") {
        return HttpReply::Respond {
            status: 202,
            headers: vec![],
            body: vec![],
        };
    }
    let result = match method {
        "initialize" => {
            json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}})
        }
        "tools/call" if body["params"]["arguments"]["q"] == "bad" => {
            json!({"content": [], "structuredContent": {"hits": "many"}})
        }
        "tools/call" => json!({"content": [], "structuredContent": {"hits": 3}}),
        _ => json!({}),
    };
    HttpReply::typed(
        200,
        "application/json",
        json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string(),
    )
}

#[tokio::test]
async fn a_structured_result_is_stored_in_the_step_and_one_off_the_declared_output_schema_is_a_tool_error()
 {
    let f = fixture().await;
    let server = TestServer::start(structured_server).await;
    let plan = json!([
        {"tool_calls": [{"name": "srv__search", "arguments": {"q": "good"}}]},
        {"tool_calls": [{"name": "srv__search", "arguments": {"q": "bad"}}]},
        {"text": "done"}
    ]);
    let mut search = f.tool(&server.url("/mcp"), "search", Effect::ReadOnly);
    // M7 (amended): what `bind_tools` carries from the catalogue entry.
    search.output_schema = Some(json!({
        "type": "object",
        "properties": {"hits": {"type": "integer"}},
        "required": ["hits"]
    }));
    let agent = f.agent(plan, vec![search]);
    let run = f.executor.create_sync("helper", "search").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "search", None).await,
        Outcome::Completed
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    let steps: Vec<&Value> = events
        .iter()
        .filter(|e| e.kind == "tool_executed")
        .map(|e| &e.payload)
        .collect();
    assert_eq!(
        (steps[0]["outcome"].as_str(), steps[0]["text"].as_str()),
        (Some("succeeded"), Some(r#"{"hits":3}"#)),
        "the structured result is what the step stores and the model reads"
    );
    assert_eq!(steps[1]["outcome"], "tool_error");
    assert!(
        steps[1]["text"]
            .as_str()
            .is_some_and(|t| t.contains("does not match the outputSchema") && t.contains("/hits")),
        "{}",
        steps[1]["text"]
    );
}
