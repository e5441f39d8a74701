//! V8, R8, R11, M4: real servers on 127.0.0.1 that take a write and then misbehave (close
//! the stream without answering, reset the connection, never answer), and runs whose log
//! already holds their end. What is asserted each time: the run's outcome, its fence, the
//! step it recorded, the audit rows and the server's own count of writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use runwarden_mcp::Effect;
use runwarden_models::{ModelError, ModelProvider, ModelRequest, ModelTurn};
use runwarden_runtime::{EFFECT_UNCERTAIN, Outcome, RunState, RunStore};
use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use runwarden_vault::CancellationSignal;
use runwarden_vault::store::AuditFilter;
use serde_json::{Value, json};

use crate::support::{Fixture, WAIT, fixture};

/// What the server does with a `tools/call` after it has read it (and started the work).
#[derive(Clone, Copy, Debug)]
enum Misbehaviour {
    /// `200 text/event-stream` and the stream ends with no response in it.
    CloseStream,
    /// The connection is reset after the body was read.
    Reset,
    /// Nothing, ever.
    Stall,
}

/// A server's own counts: the writes it started and the cancel notices it got.
#[derive(Default)]
struct Counts {
    calls: AtomicUsize,
    cancel_notices: AtomicUsize,
}

async fn misbehaving(how: Misbehaviour) -> (TestServer, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let seen = counts.clone();
    let normal = mcp_handler(vec![tool("create")], &[]);
    let server = TestServer::start(move |request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        match body["method"].as_str() {
            Some("tools/call") => {
                seen.calls.fetch_add(1, Ordering::SeqCst);
                match how {
                    Misbehaviour::CloseStream => HttpReply::typed(200, "text/event-stream", ""),
                    Misbehaviour::Reset => HttpReply::Reset,
                    Misbehaviour::Stall => HttpReply::Stall,
                }
            }
            Some("notifications/cancelled") => {
                seen.cancel_notices.fetch_add(1, Ordering::SeqCst);
                normal(request)
            }
            _ => normal(request),
        }
    })
    .await;
    (server, counts)
}

async fn events(f: &Fixture, run_id: &str) -> Vec<runwarden_runtime::RunEvent> {
    f.store.run_events(run_id, 0, 0).await.unwrap()
}

/// Every audit row's action and reason, oldest first.
async fn audit(f: &Fixture) -> Vec<(String, String)> {
    f.vault
        .audit_list(AuditFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.event.action, r.event.reason.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_non_idempotent_write_that_may_have_run_parks_the_run_for_a_person_and_keeps_its_fence() {
    for how in [
        Misbehaviour::CloseStream,
        Misbehaviour::Reset,
        Misbehaviour::Stall,
    ] {
        let f = fixture().await;
        let (server, counts) = misbehaving(how).await;
        let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]}, {"text": "never reached"}]);
        // M3: a 2 s budget, so the stalled call ends in the test's time.
        let agent = f.agent(
            plan,
            vec![f.tool_with_budget(
                &server.url("/mcp"),
                "create",
                Effect::NonIdempotentWrite,
                Duration::from_secs(2),
            )],
        );
        let run = f.executor.create_sync("helper", "go").await.unwrap();
        let outcome = tokio::time::timeout(WAIT, f.executor.execute(&run, &agent, "go", None))
            .await
            .unwrap();
        // R12: instead of failing EFFECT_UNCERTAIN, the run waits for a person.
        assert_eq!(outcome, Outcome::WaitingForApproval, "{how:?}");

        let row = f.store.run_get(&run.id).await.unwrap().unwrap();
        assert_eq!(row.status, RunState::WaitingForApproval, "{how:?}");
        assert_eq!(
            row.lease_expires_ms, None,
            "{how:?}: a parked run holds no lease"
        );
        let decisions = f
            .store
            .decision_list(runwarden_runtime::DecisionFilter {
                run_id: Some(run.id.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(decisions.len(), 1, "{how:?}");
        assert_eq!(
            decisions[0].kind,
            runwarden_runtime::DecisionKind::EffectUncertain
        );
        let message = decisions[0].message.clone().unwrap();
        assert!(message.starts_with(EFFECT_UNCERTAIN), "{how:?}: {message}");
        assert_eq!(
            row.pending_effect.as_deref(),
            Some("non_idempotent_write"),
            "{how:?}: R11 the fence stays"
        );
        assert_eq!(
            f.kinds(&run.id).await,
            [
                "run_started",
                "model_response",
                "effect_uncertain",
                "decision_asked"
            ],
            "{how:?}"
        );
        let step = &events(&f, &run.id).await[2].payload;
        assert_eq!(step["delivery"], "maybe_delivered", "{how:?}");
        let legs = step["legs"].as_array().unwrap();
        assert_eq!(legs.len(), 3, "{how:?}: {step}");
        // The step names the audit row that stands for the write: its intent.
        let call_leg = &legs[2];
        assert_eq!(call_leg["method"], "tools/call", "{how:?}: {step}");
        let audit_id = call_leg["audit_id"].as_i64().expect("the intent row's id");
        let rows = f.vault.audit_list(AuditFilter::default()).await.unwrap();
        let intent = rows.iter().find(|r| r.id == audit_id).unwrap();
        assert_eq!(intent.event.action, "http_call_started", "{how:?}");
        assert!(
            intent
                .event
                .reason
                .as_deref()
                .unwrap()
                .ends_with("tools/call"),
            "{how:?}"
        );
        assert!(step["request_id"].is_i64(), "{how:?}: {step}");

        assert_eq!(counts.calls.load(Ordering::SeqCst), 1, "{how:?}");
        // M4: the abandoned call is followed by the cancel notice.
        assert_eq!(counts.cancel_notices.load(Ordering::SeqCst), 1, "{how:?}");
        // V7: one row per request that left: initialize, initialized, tools/call, notice.
        let rows = audit(&f).await;
        let reasons: Vec<&str> = rows.iter().map(|(_, r)| r.as_str()).collect();
        assert!(
            reasons.iter().any(|r| r.ends_with("tools/call"))
                && reasons
                    .iter()
                    .any(|r| r.ends_with("notifications/cancelled")),
            "{how:?}: {rows:?}"
        );
    }
}

#[tokio::test]
async fn an_idempotent_write_that_may_have_run_keeps_its_fence_and_the_model_reads_that_it_may_have_taken_effect()
 {
    let f = fixture().await;
    let (server, counts) = misbehaving(Misbehaviour::CloseStream).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "checked"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::IdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let kinds = f.kinds(&run.id).await;
    assert_eq!(
        kinds,
        [
            "run_started",
            "model_response",
            "effect_uncertain",
            "model_response",
            "run_completed"
        ]
    );
    let step = &events(&f, &run.id).await[2].payload;
    assert!(
        step["text"]
            .as_str()
            .unwrap()
            .contains("may or may not have taken effect"),
        "{step}"
    );
    assert_eq!(counts.calls.load(Ordering::SeqCst), 1);
    assert_eq!(counts.cancel_notices.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_read_whose_stream_ends_early_is_a_failed_step_and_the_run_goes_on() {
    let f = fixture().await;
    let (server, _) = misbehaving(Misbehaviour::CloseStream).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::ReadOnly)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let step = &events(&f, &run.id).await[2];
    assert_eq!(step.kind, "tool_executed");
    assert_eq!(step.payload["outcome"], "failed");
    assert_eq!(step.payload["delivery"], "maybe_delivered");
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.pending_effect, None);
}

#[tokio::test]
async fn a_run_cancelled_during_the_handshake_was_never_fenced_and_sent_no_call() {
    let f = fixture().await;
    let normal = mcp_handler(vec![tool("create")], &[]);
    let mut server = TestServer::start(move |request: &HttpRequest| {
        if String::from_utf8_lossy(&request.body).contains("\"initialize\"") {
            HttpReply::Stall
        } else {
            normal(request)
        }
    })
    .await;
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let (executor, task_run) = (f.executor.clone(), run.clone());
    let task = tokio::spawn(async move { executor.execute(&task_run, &agent, "go", None).await });
    let initialize = server.next_request(WAIT).await;
    assert!(String::from_utf8_lossy(&initialize.body).contains("initialize"));
    f.executor.cancel(&run.id).await.unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::Cancelled
    );
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(
        row.pending_effect, None,
        "R11: the fence is stamped after the handshake, right before tools/call"
    );
    let step = &events(&f, &run.id).await[2];
    assert_eq!(step.kind, "tool_executed");
    assert_eq!(step.payload["delivery"], "not_sent");
    assert!(
        server
            .drain_requests()
            .iter()
            .all(|r| !String::from_utf8_lossy(&r.body).contains("tools/call")),
        "no tools/call left"
    );
}

#[tokio::test]
async fn a_tool_call_runs_only_after_the_model_step_that_asked_for_it_is_stored() {
    let f = fixture().await;
    let (server, counts) = misbehaving(Misbehaviour::CloseStream).await;
    f.store
        .fail_kinds
        .lock()
        .unwrap()
        .push("model_response".into());
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    assert_eq!(
        counts.calls.load(Ordering::SeqCst),
        0,
        "R8: the call was not made"
    );
    assert_eq!(server.connection_count(), 0, "nothing was sent at all");
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert!(
        row.termination_reason
            .unwrap()
            .contains("could not be recorded")
    );
}

/// A model that counts its calls and answers with a final text.
struct Counting(AtomicUsize);

#[async_trait]
impl ModelProvider for Counting {
    async fn complete(
        &self,
        _: &ModelRequest,
        _: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(ModelTurn {
            text: Some("asked again".into()),
            tool_calls: vec![],
            finish: None,
            usage: None,
        })
    }
}

#[tokio::test]
async fn a_run_whose_final_answer_is_stored_settles_from_the_log_without_calling_the_model() {
    let f = fixture().await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    f.prior(
        &run.id,
        &[
            (
                "run_started",
                json!({"agent": "helper", "prompt": "go", "owner": "test-earlier"}),
            ),
            (
                "model_response",
                json!({"round": 1, "text": "the answer", "tool_calls": []}),
            ),
        ],
    )
    .await;
    let model = Arc::new(Counting(AtomicUsize::new(0)));
    let agent = f.agent_with(model.clone(), vec![]);
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    assert_eq!(model.0.load(Ordering::SeqCst), 0, "the model was not asked");
    let kinds = f.kinds(&run.id).await;
    assert_eq!(kinds.iter().filter(|k| *k == "run_completed").count(), 1);
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.termination_reason.as_deref(), Some("the answer"));
}

#[tokio::test]
async fn a_run_whose_end_is_stored_settles_from_the_log_and_writes_no_second_terminal_step() {
    for (kind, status) in [
        ("run_completed", RunState::Completed),
        ("run_failed", RunState::Failed),
    ] {
        let f = fixture().await;
        let run = f.executor.create_sync("helper", "go").await.unwrap();
        let steps = [
            (
                "run_started",
                json!({"agent": "helper", "prompt": "go", "owner": "test-earlier"}),
            ),
            (
                "model_response",
                json!({"round": 1, "text": "the answer", "tool_calls": []}),
            ),
            (kind, json!({"reason": "as recorded"})),
        ];
        f.prior(&run.id, &steps).await;
        let model = Arc::new(Counting(AtomicUsize::new(0)));
        let agent = f.agent_with(model.clone(), vec![]);
        f.executor.execute(&run, &agent, "go", None).await;
        assert_eq!(model.0.load(Ordering::SeqCst), 0);
        assert_eq!(
            f.kinds(&run.id).await,
            ["run_started", "model_response", kind],
            "nothing was appended after the recorded end"
        );
        let row = f.store.run_get(&run.id).await.unwrap().unwrap();
        assert_eq!(row.status, status);
        assert_eq!(row.termination_reason.as_deref(), Some("as recorded"));
    }
}

#[tokio::test]
async fn a_resumed_run_whose_non_idempotent_write_is_uncertain_asks_a_person_without_sending_it_again()
 {
    let f = fixture().await;
    let (server, counts) = misbehaving(Misbehaviour::CloseStream).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let calls = json!([{"id": "c1", "name": "srv__create", "arguments": {}}]);
    f.prior(
        &run.id,
        &[
            ("run_started", json!({"agent": "helper", "prompt": "go", "owner": "test-earlier"})),
            (
                "model_response",
                json!({"round": 1, "text": null, "tool_calls": calls}),
            ),
            (
                "effect_uncertain",
                json!({"round": 1, "call_id": "c1", "tool": "srv__create", "remote": "create", "server": "srv", "effect": "non_idempotent_write", "outcome": "failed", "delivery": "maybe_delivered", "sent": true, "text": "the stream ended", "request_id": 2, "legs": [{"method": "tools/call", "answered": false, "audit_id": 5, "millis": 3}]}),
            ),
        ],
    )
    .await;
    let plan = json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    // R12: the segment that recorded the step stopped before it asked; this one asks.
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::WaitingForApproval
    );
    assert_eq!(counts.calls.load(Ordering::SeqCst), 0, "R11: never re-sent");
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::WaitingForApproval);
    let decisions = f
        .store
        .decision_list(runwarden_runtime::DecisionFilter::default())
        .await
        .unwrap();
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].call_id, "c1");
    assert!(
        decisions[0]
            .message
            .as_deref()
            .unwrap()
            .starts_with(EFFECT_UNCERTAIN)
    );
}
