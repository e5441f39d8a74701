//! L4, L5, R13 end to end: a truncated turn fails the run, usage is recorded and summed,
//! and each budget ends the run `BUDGET_EXCEEDED` through the same signal as a cancel.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_models::{
    FinishReason, ModelError, ModelProvider, ModelRequest, ModelTurn, ToolCallRequest, Usage,
};
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{Budgets, Outcome, RunState, RunStore, run_request, usage_of};
use runwarden_testkit::{TestServer, mcp_handler, tool};
use runwarden_vault::CancellationSignal;
use serde_json::json;

use crate::support::{Fixture, WAIT, fixture};

/// A model that answers with the given turns in order, then a final text.
struct Turns(Mutex<Vec<ModelTurn>>);

impl Turns {
    fn new(turns: Vec<ModelTurn>) -> Arc<Self> {
        let mut turns = turns;
        turns.reverse();
        Arc::new(Self(Mutex::new(turns)))
    }
}

#[async_trait]
impl ModelProvider for Turns {
    async fn complete(
        &self,
        _: &ModelRequest,
        _: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        let next = self.0.lock().unwrap().pop();
        Ok(next.unwrap_or_else(|| ModelTurn::new(Some("done".into()), vec![])))
    }
}

fn call(id: &str, name: &str) -> ToolCallRequest {
    ToolCallRequest {
        id: id.into(),
        name: name.into(),
        arguments: json!({}),
        invalid_arguments: None,
    }
}

fn turn(calls: Vec<ToolCallRequest>, finish: FinishReason, output_tokens: u64) -> ModelTurn {
    ModelTurn {
        text: None,
        tool_calls: calls,
        finish: Some(finish),
        usage: Some(Usage {
            input_tokens: 100,
            output_tokens,
        }),
    }
}

fn tools_calls(server: &mut TestServer) -> usize {
    server
        .drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count()
}

/// A run already running under this fixture's executor, with `budgets` in its request, as
/// an earlier segment would have left it.
async fn running_run(f: &Fixture, budgets: &Budgets) -> runwarden_runtime::Run {
    let id = uuid::Uuid::now_v7().to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    f.store
        .run_create(RunCreate {
            id: id.clone(),
            agent: "helper".into(),
            correlation: id,
            request: Some(run_request("go", budgets)),
            status: NewRunStatus::Running {
                owner: f.executor.owner().into(),
                lease_until_ms: now + 30_000,
            },
            now_ms: now,
            origin: Default::default(),
        })
        .await
        .unwrap()
}

async fn reason(f: &Fixture, run_id: &str) -> String {
    let row = f.store.run_get(run_id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed);
    row.termination_reason.unwrap()
}

#[tokio::test]
async fn a_truncated_turn_fails_the_run_model_truncated_and_none_of_its_tool_calls_run() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let model = Turns::new(vec![turn(
        vec![call("c1", "srv__create")],
        FinishReason::Length,
        64,
    )]);
    let mut agent = f.agent_with(
        model,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    agent.max_tokens = Some(64);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let outcome = f.executor.execute(&run, &agent, "go", None).await;

    assert_eq!(outcome, Outcome::Failed);
    let reason = reason(&f, &run.id).await;
    assert!(reason.starts_with("MODEL_TRUNCATED: "), "{reason}");
    assert!(reason.contains("max_tokens = 64"), "{reason}");
    assert_eq!(
        f.kinds(&run.id).await,
        ["run_started", "model_response", "run_failed"]
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    assert_eq!(events[1].payload["finish"], "length");
    assert_eq!(
        tools_calls(&mut server),
        0,
        "a cut turn's tool calls never run"
    );
}

#[tokio::test]
async fn an_empty_turn_stopped_by_a_content_filter_fails_the_run_instead_of_completing_empty() {
    let f = fixture().await;
    let model = Turns::new(vec![turn(vec![], FinishReason::ContentFilter, 0)]);
    let agent = f.agent_with(model, vec![]);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let reason = reason(&f, &run.id).await;
    assert!(reason.starts_with("MODEL_NO_ANSWER: "), "{reason}");
    assert!(reason.contains("content_filter"), "{reason}");
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    assert_eq!(events[1].payload["finish"], "content_filter");
}

#[tokio::test]
async fn a_refusal_with_text_is_recorded_by_name_and_the_text_is_the_answer() {
    let f = fixture().await;
    let mut refused = turn(vec![], FinishReason::Refusal, 5);
    refused.text = Some("I cannot help with that".into());
    let agent = f.agent_with(Turns::new(vec![refused]), vec![]);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    assert_eq!(events[1].payload["finish"], "refusal");
}

#[tokio::test]
async fn usage_is_recorded_per_model_step_and_summed_over_the_run() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let mut last = turn(vec![], FinishReason::Stop, 7);
    last.text = Some("found".into());
    let model = Turns::new(vec![
        turn(vec![call("c1", "srv__lookup")], FinishReason::ToolCalls, 30),
        last,
    ]);
    let agent = f.agent_with(
        model,
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    let steps: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "model_response")
        .map(|e| e.payload["usage"].clone())
        .collect();
    assert_eq!(
        steps,
        [
            json!({"input_tokens": 100, "output_tokens": 30}),
            json!({"input_tokens": 100, "output_tokens": 7})
        ]
    );
    assert_eq!(
        usage_of(&events),
        Usage {
            input_tokens: 200,
            output_tokens: 37
        }
    );
}

#[tokio::test]
async fn an_output_token_budget_that_runs_out_ends_the_run_before_the_turns_tool_calls() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let model = Turns::new(vec![
        turn(vec![call("c1", "srv__lookup")], FinishReason::ToolCalls, 60),
        turn(vec![call("c2", "srv__lookup")], FinishReason::ToolCalls, 60),
    ]);
    let mut agent = f.agent_with(
        model,
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    agent.budgets.max_output_tokens_total = Some(100);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let reason = reason(&f, &run.id).await;
    assert!(
        reason.starts_with("BUDGET_EXCEEDED: max_output_tokens_total = 100"),
        "{reason}"
    );
    assert!(reason.contains("used 120"), "{reason}");
    assert_eq!(
        tools_calls(&mut server),
        1,
        "only the first turn's call ran"
    );
    assert_eq!(f.kinds(&run.id).await.last().unwrap(), "run_failed");
}

#[tokio::test]
async fn a_tool_call_budget_refuses_the_call_past_it_before_it_is_sent() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let plan = json!([{"tool_calls": [
        {"name": "srv__lookup", "arguments": {}},
        {"name": "srv__lookup", "arguments": {}}
    ]}, {"text": "never reached"}]);
    let mut agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    agent.budgets.max_tool_calls = Some(1);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let reason = reason(&f, &run.id).await;
    assert!(
        reason.starts_with("BUDGET_EXCEEDED: max_tool_calls = 1"),
        "{reason}"
    );
    assert_eq!(tools_calls(&mut server), 1);
}

#[tokio::test]
async fn a_wall_clock_budget_tears_down_a_write_in_flight_at_once_and_the_write_keeps_its_fence() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &["create"])).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "never"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let budgets = Budgets {
        max_wall_seconds: Some(1),
        ..Budgets::default()
    };
    let run = f
        .executor
        .create_sync_with("helper", "go", &budgets, Default::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    let (executor, task_run) = (f.executor.clone(), run.clone());
    let task = tokio::spawn(async move { executor.execute(&task_run, &agent, "go", None).await });
    server.next_close(WAIT).await;
    let late = Instant::now().saturating_duration_since(deadline);
    // The old poll would take up to a second more; woken at once this is milliseconds.
    assert!(late < Duration::from_millis(300), "torn down {late:?} late");
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Failed
    );
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed);
    let reason = row.termination_reason.unwrap();
    assert!(
        reason.starts_with("BUDGET_EXCEEDED: max_wall_seconds = 1"),
        "{reason}"
    );
    // R11 as after a cancel: the write was on the wire, so its fence and step say so.
    assert_eq!(row.pending_effect.as_deref(), Some("non_idempotent_write"));
    assert_eq!(
        f.kinds(&run.id).await,
        [
            "run_started",
            "model_response",
            "effect_uncertain",
            "run_failed"
        ]
    );
}

#[tokio::test]
async fn a_resumed_run_keeps_its_stored_budgets_and_counts_the_calls_already_made() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let budgets = Budgets {
        max_tool_calls: Some(1),
        ..Budgets::default()
    };
    let run = running_run(&f, &budgets).await;
    let id = run.id.clone();
    // An earlier segment made one call of a two-call turn, then its worker died.
    f.prior(
        &id,
        &[
            ("run_started", json!({"agent": "helper", "prompt": "go", "owner": "w-0"})),
            (
                "model_response",
                json!({"round": 1, "text": null, "tool_calls": [
                    {"id": "c1", "name": "srv__lookup", "arguments": {}},
                    {"id": "c2", "name": "srv__lookup", "arguments": {}}
                ]}),
            ),
            (
                "tool_executed",
                json!({"round": 1, "call_id": "c1", "tool": "srv__lookup", "outcome": "succeeded", "text": "ok"}),
            ),
        ],
    )
    .await;
    // The agent sets no budget: the run's stored one still applies.
    let agent = f.agent(
        json!([{"text": "never reached"}]),
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let reason = reason(&f, &id).await;
    assert!(
        reason.starts_with("BUDGET_EXCEEDED: max_tool_calls = 1"),
        "{reason}"
    );
    assert_eq!(
        tools_calls(&mut server),
        0,
        "the second call was never sent"
    );
}

#[tokio::test]
async fn arguments_the_model_wrote_badly_reach_it_as_the_tools_error_and_nothing_is_sent() {
    let f = fixture().await;
    let mut server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let mut bad = call("c1", "srv__create");
    bad.arguments = serde_json::Value::Null;
    bad.invalid_arguments = Some("EOF while parsing an object at line 1 column 9".into());
    let model = Turns::new(vec![turn(vec![bad], FinishReason::ToolCalls, 9)]);
    let agent = f.agent_with(
        model,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed,
        "L4: a badly written call is the model's to fix, not the run's end"
    );
    let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
    let step = events
        .iter()
        .find(|e| e.kind == "tool_executed")
        .expect("the refused call is a step");
    assert_eq!(
        step.payload["text"],
        "arguments were not valid JSON: EOF while parsing an object at line 1 column 9"
    );
    assert_eq!(tools_calls(&mut server), 0, "nothing reached the server");
}

/// A model that streams `tokens` output deltas, reporting each to the request's progress,
/// then holds the call until its signal says stop (as the vault would drop the stream).
struct Streaming {
    tokens: u64,
}

#[async_trait]
impl ModelProvider for Streaming {
    async fn complete(
        &self,
        request: &ModelRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        let signal = signal.expect("a run's model call carries its signal");
        for n in 1..=self.tokens {
            if let Some(progress) = &request.progress {
                progress.report(n);
            }
        }
        let stopped = tokio::time::timeout(WAIT, async {
            while !signal.is_cancelled() {
                signal.woken().await;
            }
        })
        .await;
        assert!(stopped.is_ok(), "the budget woke the call in flight");
        Err(ModelError::Cancelled { in_flight: true })
    }
}

#[tokio::test]
async fn an_output_token_budget_tears_down_the_stream_that_goes_over_it() {
    let f = fixture().await;
    let agent = f.agent_with(Arc::new(Streaming { tokens: 50 }), vec![]);
    let budgets = Budgets {
        max_output_tokens_total: Some(10),
        ..Budgets::default()
    };
    let run = f
        .executor
        .create_sync_with("helper", "go", &budgets, Default::default())
        .await
        .unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let reason = reason(&f, &run.id).await;
    assert!(
        reason.starts_with("BUDGET_EXCEEDED: max_output_tokens_total = 10 (the run used 11)"),
        "{reason}"
    );
}

/// [`Turns`] that also keeps the `max_tokens` each request carried.
struct Capped {
    turns: Arc<Turns>,
    caps: Mutex<Vec<Option<u32>>>,
}

#[async_trait]
impl ModelProvider for Capped {
    async fn complete(
        &self,
        request: &ModelRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        self.caps.lock().unwrap().push(request.max_tokens);
        self.turns.complete(request, signal).await
    }
}

#[tokio::test]
async fn each_model_call_may_go_one_token_past_the_remaining_budget_and_no_further() {
    let f = fixture().await;
    let server = TestServer::start(mcp_handler(vec![tool("lookup")], &[])).await;
    let mut last = turn(vec![], FinishReason::Stop, 5);
    last.text = Some("found".into());
    let model = Arc::new(Capped {
        turns: Turns::new(vec![
            turn(vec![call("c1", "srv__lookup")], FinishReason::ToolCalls, 30),
            last,
        ]),
        caps: Mutex::default(),
    });
    let agent = f.agent_with(
        model.clone(),
        vec![f.tool(&server.url("/mcp"), "lookup", Effect::ReadOnly)],
    );
    let budgets = Budgets {
        max_output_tokens_total: Some(100),
        ..Budgets::default()
    };
    let run = f
        .executor
        .create_sync_with("helper", "go", &budgets, Default::default())
        .await
        .unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    // R13: 100 left, then 70: the server stops by itself just past the budget.
    assert_eq!(*model.caps.lock().unwrap(), [Some(101), Some(71)]);

    // Without a token total the provider's own max_tokens is left alone.
    let model = Arc::new(Capped {
        turns: Turns::new(vec![]),
        caps: Mutex::default(),
    });
    let agent = f.agent_with(model.clone(), vec![]);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    f.executor.execute(&run, &agent, "go", None).await;
    assert_eq!(*model.caps.lock().unwrap(), [None]);
}

#[tokio::test]
async fn a_turn_cut_by_the_token_budget_ends_budget_exceeded_live_and_on_resume() {
    let f = fixture().await;
    // The server stopped at the cap (10 left + 1) and said why: the budget cut it.
    let agent = f.agent_with(
        Turns::new(vec![turn(vec![], FinishReason::Length, 11)]),
        vec![],
    );
    let budgets = Budgets {
        max_output_tokens_total: Some(10),
        ..Budgets::default()
    };
    let run = f
        .executor
        .create_sync_with("helper", "go", &budgets, Default::default())
        .await
        .unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    assert_eq!(
        reason(&f, &run.id).await,
        "BUDGET_EXCEEDED: max_output_tokens_total = 10 (the run used 11)"
    );

    // The same stored turn, found by a later segment (a crash before the settle).
    let resumed = running_run(&f, &budgets).await;
    f.prior(
        &resumed.id,
        &[
            (
                "run_started",
                json!({"agent": "helper", "prompt": "go", "owner": "test-earlier"}),
            ),
            (
                "model_response",
                json!({"round": 1, "text": "1, 2, 3", "tool_calls": [], "finish": "length", "usage": {"input_tokens": 9, "output_tokens": 11}}),
            ),
        ],
    )
    .await;
    let never = f.agent_with(Turns::new(vec![]), vec![]);
    f.executor.execute(&resumed, &never, "go", None).await;
    assert!(
        reason(&f, &resumed.id)
            .await
            .starts_with("BUDGET_EXCEEDED: max_output_tokens_total = 10"),
        "{}",
        reason(&f, &resumed.id).await
    );
}
