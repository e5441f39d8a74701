//! R4, R5, R6 end to end: a cancel reaches a tool call or a model call on the wire, and a
//! cancel at a boundary stops the run before the next call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_models::{ModelError, ModelProvider, ModelRequest, ModelTurn, OpenAiCompatible};
use runwarden_runtime::{
    BoundTool, CancelAnswer, CancelRefused, Canceller, Outcome, RunState, RunStore, cancel_run,
};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{HttpReply, TestServer, mcp_handler, tool};
use runwarden_vault::CancellationSignal;
use runwarden_vault::audit::action;
use serde_json::json;

use crate::support::{Fixture, WAIT, final_turn, fixture};

async fn wait_for_tools_call(server: &mut TestServer) {
    loop {
        let request = server.next_request(WAIT).await;
        if String::from_utf8_lossy(&request.body).contains("\"tools/call\"") {
            return;
        }
    }
}

#[tokio::test]
async fn a_cancel_through_this_process_tears_down_a_stalled_write_and_keeps_the_fence() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &["create"])).await;
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "never reached"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let (executor, task_run) = (f.executor.clone(), run.clone());
    let task = tokio::spawn(async move { executor.execute(&task_run, &agent, "go", None).await });
    wait_for_tools_call(&mut server).await;

    let issued = Instant::now();
    assert_eq!(
        f.executor.cancel(&run.id).await.unwrap(),
        CancelAnswer::Cancelled {
            previous: RunState::Running
        }
    );
    server.next_close(WAIT).await;
    // Generous bound: woken in-process this takes milliseconds; it catches a 10x regression.
    assert!(
        issued.elapsed() < Duration::from_millis(500),
        "took {:?}",
        issued.elapsed()
    );
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Cancelled
    );

    assert_eq!(
        f.kinds(&run.id).await,
        [
            "run_started",
            "model_response",
            "effect_uncertain",
            "run_stopped"
        ]
    );
    // R11: the write was on the wire, so its step says its effect is unknown.
    let step = &f.store.run_events(&run.id, 0, 0).await.unwrap()[2];
    assert_eq!(step.payload["outcome"], "cancelled");
    assert_eq!(step.payload["delivery"], "maybe_delivered");
    assert!(step.payload["text"].as_str().unwrap().contains("cancelled"));
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Cancelled);
    assert_eq!(
        row.pending_effect.as_deref(),
        Some("non_idempotent_write"),
        "a cancelled mid-write run keeps its mark"
    );
    assert!(
        f.audit_actions()
            .await
            .contains(&action::HTTP_CALL_CANCELLED.to_string())
    );
    let calls = server
        .drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count();
    assert_eq!(
        calls, 0,
        "nothing retried the write after the one on the wire"
    );
}

#[tokio::test]
async fn a_cancel_written_by_another_process_is_seen_by_the_periodic_refresh_within_about_a_second()
{
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &["create"])).await;
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let (executor, task_run) = (f.executor.clone(), run.clone());
    let task = tokio::spawn(async move { executor.execute(&task_run, &agent, "go", None).await });
    wait_for_tools_call(&mut server).await;

    // Straight to the row, as `runwarden cancel` in another process on the same SQLite
    // file does: no hub, nothing on this process's change feed.
    let other = f.other_process();
    let issued = Instant::now();
    other.run_cancel(&run.id, 0).await.unwrap();
    server.next_close(WAIT).await;
    assert!(
        issued.elapsed() < Duration::from_secs(3),
        "poll-only took {:?}",
        issued.elapsed()
    );
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Cancelled
    );
}

#[tokio::test]
async fn a_cancel_announced_by_another_node_tears_down_a_call_in_flight_at_once() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &["create"])).await;
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let (executor, task_run) = (f.executor.clone(), run.clone());
    let task = tokio::spawn(async move { executor.execute(&task_run, &agent, "go", None).await });
    wait_for_tools_call(&mut server).await;

    // Another node writes the row and its NOTIFY reaches this process's change feed; this
    // process never cancelled anything (R6 amended).
    f.other_process().run_cancel(&run.id, 0).await.unwrap();
    let issued = Instant::now();
    f.store
        .inner
        .change_feed()
        .publish(runwarden_runtime::Change::Status {
            run_id: run.id.clone(),
            status: RunState::Cancelled,
        });
    server.next_close(WAIT).await;
    // Generous bound: woken, this takes milliseconds; the periodic refresh alone takes up
    // to a second and the backstop tick another.
    assert!(
        issued.elapsed() < Duration::from_millis(500),
        "took {:?}",
        issued.elapsed()
    );
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Cancelled
    );
}

#[tokio::test]
async fn a_cancel_tears_down_a_model_call_in_flight() {
    let f = fixture().await;
    let mut model = TestServer::start(|_| HttpReply::Stall).await;
    let provider = Arc::new(OpenAiCompatible::new(
        f.egress.clone(),
        model.url("/v1"),
        "slow-model",
    ));
    let agent = f.agent_with(provider, vec![]);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let (executor, task_run) = (f.executor.clone(), run.clone());
    let task = tokio::spawn(async move { executor.execute(&task_run, &agent, "go", None).await });
    model.next_request(WAIT).await;
    f.executor.cancel(&run.id).await.unwrap();
    model.next_close(WAIT).await;
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Cancelled
    );
    assert_eq!(
        f.kinds(&run.id).await,
        ["run_started", "model_cancelled", "run_stopped"]
    );
    assert_eq!(f.audit_actions().await, [action::HTTP_CALL_CANCELLED]);
}

#[tokio::test]
async fn a_cancel_at_a_boundary_stops_the_run_before_the_next_call_is_sent() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    // The scripted model's turn is cheap; cancel before execution starts its next step.
    f.executor.cancel(&run.id).await.unwrap();
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Cancelled
    );
    assert_eq!(server.connection_count(), 0, "the server receives nothing");
    assert!(f.audit_actions().await.is_empty());
}

#[tokio::test]
async fn a_call_whose_run_is_already_cancelled_is_refused_before_send() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    f.executor.cancel(&run.id).await.unwrap();
    let tool = f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite);
    let signal = f.watcher.signal(&run.id).await;
    let call = runwarden_mcp::McpCall {
        tool: "create".into(),
        arguments: Default::default(),
        correlation: None,
        gate: None,
        elicitor: None,
        output_schema: None,
        notices: None,
        ..Default::default()
    };
    let outcome = tool.client.call_tool(call, Some(&signal)).await;
    assert!(!outcome.result.sent());
    assert_eq!(server.connection_count(), 0);
    assert_eq!(
        f.audit_actions().await,
        [action::HTTP_CALL_CANCELLED_BEFORE_SEND]
    );
}

#[tokio::test]
async fn a_terminal_run_cannot_be_cancelled_and_a_cancelled_one_cannot_be_settled() {
    let f = fixture().await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let agent = f.agent(json!([{"text": "done"}]), vec![]);
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    assert_eq!(
        f.executor.cancel(&run.id).await.unwrap(),
        CancelAnswer::AlreadyTerminal(RunState::Completed)
    );

    let second = f.executor.create_sync("helper", "go").await.unwrap();
    f.executor.cancel(&second.id).await.unwrap();
    assert_eq!(
        f.executor.cancel(&second.id).await.unwrap(),
        CancelAnswer::AlreadyTerminal(RunState::Cancelled)
    );
    // Executing it again (a resume) stops at once and never leaves `cancelled`.
    assert_eq!(
        f.executor.execute(&second, &agent, "go", None).await,
        Outcome::Cancelled
    );
    assert_eq!(
        f.store.run_get(&second.id).await.unwrap().unwrap().status,
        RunState::Cancelled
    );
}

#[tokio::test]
async fn an_operators_cancel_names_the_state_it_left_or_why_it_changed_nothing() {
    let f = fixture().await;
    let other = f.other_process();
    let queued = f.executor.create_sync("helper", "go").await.unwrap();
    // Through the store alone (a process that executes nothing), then through the executor.
    assert_eq!(
        cancel_run(Canceller::Store(&other), &queued.id)
            .await
            .unwrap(),
        RunState::Running
    );
    let refused = cancel_run(Canceller::Executor(&f.executor), &queued.id)
        .await
        .unwrap_err();
    assert!(matches!(
        refused,
        CancelRefused::Finished {
            state: RunState::Cancelled,
            ..
        }
    ));
    assert_eq!(
        refused.to_string(),
        format!(
            "run {} is already cancelled: a finished run cannot be cancelled",
            queued.id
        )
    );
    let missing = cancel_run(Canceller::Store(&other), "no-such-run")
        .await
        .unwrap_err();
    assert_eq!(missing.to_string(), "no run with id no-such-run");
}

#[tokio::test]
async fn each_step_is_followed_by_one_read_of_the_run_row() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let plan = json!([
        {"tool_calls": [{"name": "srv__lookup", "arguments": {}}]},
        {"tool_calls": [{"name": "srv__lookup", "arguments": {}}]},
        {"text": "done"}
    ]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    let before = f.status_reads();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    // R5 and R6 together: each call's signal is taken at the boundary before it, and the
    // read that answers its first question is that boundary's read of the row: one read
    // per call (three model calls, two tool calls). The final answer is stored with the
    // run's end by one guarded write, which is its read.
    assert_eq!(f.status_reads() - before, 5);
}

#[tokio::test]
async fn a_cancel_during_a_tool_call_stops_the_run_before_the_next_model_call() {
    let f = fixture().await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    // The server answers the tool call after another process cancelled the run: nothing
    // wakes this one, so only the read after the tool step can see it.
    let (other, run_id) = (f.other_process(), run.id.clone());
    let answer = mcp_handler(vec![tool("lookup")], &[]);
    let server = TestServer::start(move |request| {
        if String::from_utf8_lossy(&request.body).contains("\"tools/call\"") {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    runtime.block_on(other.run_cancel(&run_id, 0)).unwrap();
                });
            });
        }
        answer(request)
    })
    .await;
    let plan = json!([
        {"tool_calls": [{"name": "srv__lookup", "arguments": {}}]},
        {"text": "done"}
    ]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Cancelled
    );
    // R5: the tool's step is stored, then the run stops; the model is not asked again.
    assert_eq!(
        f.kinds(&run.id).await,
        [
            "run_started",
            "model_response",
            "tool_executed",
            "run_stopped"
        ]
    );
}

/// A model that, while it answers, has another process cancel the run (nothing wakes
/// this one), then gives `answer`.
struct CancelledWhileAnswering {
    other: SqliteStore,
    run_id: String,
    answer: ModelTurn,
}

#[async_trait]
impl ModelProvider for CancelledWhileAnswering {
    async fn complete(
        &self,
        _: &ModelRequest,
        _: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        self.other.run_cancel(&self.run_id, 0).await.unwrap();
        Ok(self.answer.clone())
    }
}

/// Executes a run whose model, while it answers, has another process cancel the run and
/// then gives `answer`. R5: the model's step is stored and the run records its stop, not
/// a completion and no tool step. Answers the run's id.
async fn cancelled_while_answering(
    f: &Fixture,
    answer: ModelTurn,
    tools: Vec<BoundTool>,
) -> String {
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let model = Arc::new(CancelledWhileAnswering {
        other: f.other_process(),
        run_id: run.id.clone(),
        answer,
    });
    let agent = f.agent_with(model, tools);
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Cancelled
    );
    assert_eq!(
        f.kinds(&run.id).await,
        ["run_started", "model_response", "run_stopped"]
    );
    run.id
}

#[tokio::test]
async fn a_final_answer_after_a_cancel_won_the_row_is_stored_and_the_run_stays_cancelled() {
    let f = fixture().await;
    // The write that would have ended the run is refused; the answer's step is stored alone.
    let run_id = cancelled_while_answering(&f, final_turn("done"), vec![]).await;
    let row = f.store.run_get(&run_id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Cancelled);
}

#[tokio::test]
async fn a_cancel_during_a_model_call_stops_the_run_before_the_tool_call_it_asked_for() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let call = serde_json::from_value(json!({"id": "c1", "name": "srv__lookup", "arguments": {}}))
        .unwrap();
    let answer = ModelTurn {
        tool_calls: vec![call],
        ..final_turn("")
    };
    // A read-only tool: no fence would stop it, only the boundary's read.
    let tools = vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)];
    cancelled_while_answering(&f, answer, tools).await;
    assert_eq!(server.connection_count(), 0, "the server receives nothing");
    assert!(f.audit_actions().await.is_empty());
}
