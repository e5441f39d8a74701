//! R12 in process: operator decisions over a real SQLite store and real MCP servers on
//! 127.0.0.1. A required approval parks the run before anything is sent; approve runs the
//! call once (with an operator's edit if given), deny and expiry reach the model as the
//! tool's result; an uncertain write waits for a person, whose answer does what it says.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runwarden_mcp::Effect;
use runwarden_runtime::queue::{Claim, QueueStore};
use runwarden_runtime::{
    Answer, AnswerRefusal, AnswerRequest, DecideError, Decision, DecisionFilter, DecisionKind,
    DecisionStatus, Outcome, RunState, RunStore, decide, expire_due,
};
use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::{Fixture, WAIT, fixture};

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// An MCP server that records the arguments of every `tools/call` it gets.
async fn recording() -> (TestServer, Arc<Mutex<Vec<Value>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let normal = mcp_handler(vec![tool("create")], &[]);
    let server = TestServer::start(move |request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call" {
            seen.lock()
                .unwrap()
                .push(body["params"]["arguments"].clone());
        }
        normal(request)
    })
    .await;
    (server, calls)
}

/// A server that starts the write and closes the stream without an answer (R11).
async fn closing() -> (TestServer, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let normal = mcp_handler(vec![tool("create")], &[]);
    let server = TestServer::start(move |request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"] == "tools/call" {
            seen.fetch_add(1, Ordering::SeqCst);
            return HttpReply::typed(200, "text/event-stream", "");
        }
        normal(request)
    })
    .await;
    (server, calls)
}

fn plan() -> Value {
    json!([
        {"tool_calls": [{"name": "srv__create", "arguments": {"q": "printer"}}]},
        {"text": "done"}
    ])
}

/// The one decision of a run.
async fn decision_of(f: &Fixture, run_id: &str) -> Decision {
    let mut all = f
        .store
        .decision_list(DecisionFilter {
            run_id: Some(run_id.into()),
            ..DecisionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "one decision: {all:?}");
    all.remove(0)
}

/// What a worker does once the run is queued again: claim it, execute it.
/// A run whose one non-idempotent `create` call needs an approval that expires after
/// `approval`, executed until it parked on it.
struct Parked {
    server: TestServer,
    calls: Arc<Mutex<Vec<Value>>>,
    agent: runwarden_runtime::AgentSpec,
    run: runwarden_runtime::Run,
    pending: Decision,
}

async fn parked(f: &Fixture, approval: Duration) -> Parked {
    let (server, calls) = recording().await;
    let mut create = f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite);
    create.approval = Some(approval);
    let agent = f.agent(plan(), vec![create]);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    f.executor.execute(&run, &agent, "go", None).await;
    let pending = decision_of(f, &run.id).await;
    Parked {
        server,
        calls,
        agent,
        run,
        pending,
    }
}

async fn resume(f: &Fixture, agent: &runwarden_runtime::AgentSpec) -> Outcome {
    let claim = Claim {
        owner: f.executor.owner().into(),
        lease_until_ms: now() + f.executor.lease_ms(),
        now_ms: now(),
        agents: None,
        start: false,
    };
    let run = f
        .store
        .inner
        .run_claim(claim)
        .await
        .unwrap()
        .expect("an answered run is queued and due");
    tokio::time::timeout(WAIT, f.executor.execute(&run, agent, "go", None))
        .await
        .unwrap()
}

async fn answer(f: &Fixture, id: &str, request: AnswerRequest) -> Result<Decision, DecideError> {
    let decision = f.store.decision_get(id).await.unwrap().unwrap();
    let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": false});
    decide(&*f.store, &decision, request, "cli", Some(&schema), now()).await
}

fn reply(answer: Answer) -> AnswerRequest {
    AnswerRequest {
        answer: Some(answer),
        ..AnswerRequest::default()
    }
}

async fn tool_text(f: &Fixture, run_id: &str) -> (String, String) {
    let events = f.store.run_events(run_id, 0, 0).await.unwrap();
    let step = events
        .iter()
        .find(|e| e.kind == "tool_executed")
        .expect("a tool step");
    (
        step.payload["outcome"].as_str().unwrap().to_string(),
        step.payload["text"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_required_approval_parks_the_run_and_approve_runs_the_call_exactly_once() {
    let f = fixture().await;
    let (mut server, calls) = recording().await;
    let mut create = f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite);
    create.approval = Some(Duration::from_secs(3600));
    let agent = f.agent(plan(), vec![create]);
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let outcome = tokio::time::timeout(WAIT, f.executor.execute(&run, &agent, "go", None))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::WaitingForApproval);
    assert!(
        calls.lock().unwrap().is_empty(),
        "R12: nothing reaches the server"
    );
    assert_eq!(
        server.drain_requests().len(),
        0,
        "not even the handshake: the run asked before it opened a session"
    );
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::WaitingForApproval);
    assert_eq!(row.lease_expires_ms, None, "a parked run holds no lease");
    assert_eq!(
        row.pending_effect, None,
        "nothing was fenced: nothing was sent"
    );
    let pending = decision_of(&f, &run.id).await;
    assert_eq!(pending.kind, DecisionKind::Approval);
    assert_eq!(pending.arguments, json!({"q": "printer"}));
    assert!(!pending.call_id.is_empty(), "bound to the model's call");

    answer(&f, &pending.id, reply(Answer::Approve))
        .await
        .unwrap();
    assert_eq!(resume(&f, &agent).await, Outcome::Completed);
    assert_eq!(
        *calls.lock().unwrap(),
        [json!({"q": "printer"})],
        "exactly once"
    );
    let kinds = f.kinds(&run.id).await;
    assert_eq!(
        kinds,
        [
            "run_started",
            "model_response",
            "decision_asked",
            "decision_answered",
            "run_resumed",
            "tool_executed",
            "model_response",
            "run_completed"
        ]
    );
    let again = answer(&f, &pending.id, reply(Answer::Deny)).await;
    assert!(
        matches!(
            again,
            Err(DecideError::Invalid(_))
                | Err(DecideError::Refused {
                    refusal: AnswerRefusal::AlreadyAnswered,
                    ..
                })
        ),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_denial_reaches_the_model_as_the_tool_result_and_the_run_completes() {
    let f = fixture().await;
    let Parked {
        server: _server,
        calls,
        agent,
        run,
        pending,
    } = parked(&f, Duration::from_secs(3600)).await;

    let no_reason = answer(&f, &pending.id, reply(Answer::Deny)).await;
    assert!(
        matches!(&no_reason, Err(DecideError::Invalid(m)) if m.contains("reason")),
        "a denial needs a reason: {no_reason:?}"
    );
    let wrong = answer(&f, &pending.id, reply(Answer::Applied)).await;
    assert!(
        matches!(wrong, Err(DecideError::WrongAnswer { .. })),
        "an approval takes approve, deny or cancel"
    );
    let deny = AnswerRequest {
        reason: Some("not on a Friday".into()),
        ..reply(Answer::Deny)
    };
    let denied = answer(&f, &pending.id, deny).await.unwrap();
    assert_eq!(denied.actor.as_deref(), Some("cli"));
    assert_eq!(resume(&f, &agent).await, Outcome::Completed);
    assert!(
        calls.lock().unwrap().is_empty(),
        "a denied call is never made"
    );
    let (outcome, text) = tool_text(&f, &run.id).await;
    assert_eq!(outcome, "denied");
    assert_eq!(text, "denied by an operator: not on a Friday");
}

#[tokio::test]
async fn edited_arguments_are_checked_against_the_schema_and_reach_the_server() {
    let f = fixture().await;
    let Parked {
        server: _server,
        calls,
        agent,
        run,
        pending,
    } = parked(&f, Duration::from_secs(3600)).await;

    let bad = AnswerRequest {
        arguments: Some(json!({"q": 5})),
        ..reply(Answer::Approve)
    };
    let refused = answer(&f, &pending.id, bad).await;
    assert!(
        matches!(&refused, Err(DecideError::Invalid(m)) if m.contains("$.q")),
        "{refused:?}"
    );
    assert_eq!(
        f.store
            .decision_get(&pending.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        DecisionStatus::Pending,
        "a refused edit leaves the decision pending"
    );
    let edited = AnswerRequest {
        arguments: Some(json!({"q": "printer on floor 2"})),
        ..reply(Answer::Approve)
    };
    answer(&f, &pending.id, edited).await.unwrap();
    assert_eq!(resume(&f, &agent).await, Outcome::Completed);
    assert_eq!(
        *calls.lock().unwrap(),
        [json!({"q": "printer on floor 2"})],
        "the operator's arguments, once"
    );
    let answered = f.store.decision_get(&pending.id).await.unwrap().unwrap();
    assert_eq!(
        answered.arguments,
        json!({"q": "printer"}),
        "both are recorded"
    );
    assert_eq!(
        answered.answer_arguments,
        Some(json!({"q": "printer on floor 2"}))
    );
    let (_, text) = tool_text(&f, &run.id).await;
    assert!(
        text.starts_with("an operator changed the arguments"),
        "the model is told: {text}"
    );
}

#[tokio::test]
async fn an_approval_nobody_answers_expires_as_a_denial_with_reason_expired() {
    let f = fixture().await;
    let Parked {
        server: _server,
        calls,
        agent,
        run,
        pending,
    } = parked(&f, Duration::from_millis(1)).await;

    let after = pending.expires_ms;
    assert_eq!(expire_due(&*f.store, after).await.unwrap(), 1);
    let late = answer(&f, &pending.id, reply(Answer::Approve)).await;
    assert!(
        matches!(
            late,
            Err(DecideError::Refused {
                refusal: AnswerRefusal::Expired,
                ..
            })
        ),
        "{late:?}"
    );
    let expired = f.store.decision_get(&pending.id).await.unwrap().unwrap();
    assert_eq!(expired.status, DecisionStatus::Expired);
    assert_eq!(expired.actor.as_deref(), Some("runwarden"));
    assert_eq!(resume(&f, &agent).await, Outcome::Completed);
    assert!(calls.lock().unwrap().is_empty());
    let (outcome, text) = tool_text(&f, &run.id).await;
    assert_eq!(
        (outcome.as_str(), text.as_str()),
        ("denied", "denied by an operator: expired")
    );
}

#[tokio::test]
async fn an_approval_after_a_cancel_is_refused_and_nothing_is_sent() {
    let f = fixture().await;
    let Parked {
        server: _server,
        calls,
        agent: _,
        run,
        pending,
    } = parked(&f, Duration::from_secs(3600)).await;
    f.executor.cancel(&run.id).await.unwrap();
    let refused = answer(&f, &pending.id, reply(Answer::Approve)).await;
    let Err(DecideError::Refused { refusal, message }) = refused else {
        panic!("an approval after a cancel is refused: {refused:?}");
    };
    assert_eq!(refusal, AnswerRefusal::RunCancelled);
    assert!(message.contains("was cancelled"), "{message}");
    assert!(calls.lock().unwrap().is_empty());
    assert_eq!(
        f.store.run_get(&run.id).await.unwrap().unwrap().status,
        RunState::Cancelled
    );
}

#[tokio::test]
async fn each_answer_to_an_uncertain_write_does_what_it_says() {
    for reply_with in [Answer::Applied, Answer::NotApplied, Answer::Cancel] {
        let f = fixture().await;
        let (server, calls) = closing().await;
        let agent = f.agent(
            plan(),
            vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
        );
        let run = f.executor.create_sync("helper", "go").await.unwrap();
        let parked = tokio::time::timeout(WAIT, f.executor.execute(&run, &agent, "go", None))
            .await
            .unwrap();
        assert_eq!(parked, Outcome::WaitingForApproval);
        let pending = decision_of(&f, &run.id).await;
        assert_eq!(pending.kind, DecisionKind::EffectUncertain);
        let wrong = answer(&f, &pending.id, reply(Answer::Approve)).await;
        assert!(
            matches!(wrong, Err(DecideError::WrongAnswer { .. })),
            "{wrong:?}"
        );

        answer(&f, &pending.id, reply(reply_with)).await.unwrap();
        let row = f.store.run_get(&run.id).await.unwrap().unwrap();
        if reply_with == Answer::Cancel {
            assert_eq!(row.status, RunState::Cancelled, "cancel cancels the run");
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            continue;
        }
        assert_eq!(
            row.pending_effect, None,
            "{reply_with:?}: the fence is cleared"
        );
        assert_eq!(
            resume(&f, &agent).await,
            Outcome::Completed,
            "{reply_with:?}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{reply_with:?}: R11 nothing re-sends the write"
        );
        let events = f.store.run_events(&run.id, 0, 0).await.unwrap();
        let answered = events
            .iter()
            .find(|e| e.kind == "decision_answered")
            .unwrap();
        assert_eq!(answered.payload["answer"], json!(reply_with.as_str()));
        assert_eq!(
            events.last().unwrap().kind,
            "run_completed",
            "{reply_with:?}: the model went on from what the person said"
        );
    }
}

/// A server's question during a call of the run `run_id` (which `f.executor` holds).
fn elicitor(f: &Fixture, run_id: &str) -> runwarden_runtime::RunElicitor {
    runwarden_runtime::RunElicitor::new(
        f.store.clone(),
        run_id,
        f.executor.owner(),
        1, // the epoch of a run claimed at birth
        1,
        "c1",
        "srv__create",
        json!({"q": "printer"}),
    )
}

fn question(timeout: Duration) -> runwarden_mcp::ElicitationRequest {
    runwarden_mcp::ElicitationRequest {
        server: "srv".into(),
        tool: "create".into(),
        message: "which queue should the ticket go to?".into(),
        requested_schema: json!({
            "type": "object",
            "properties": {"queue": {"type": "string", "enum": ["hardware", "software"]}},
            "required": ["queue"]
        }),
        timeout,
    }
}

/// Waits (on the change feed, not a sleep) until the run has a decision; returns it.
async fn asked(
    f: &Fixture,
    run_id: &str,
    feed: &mut tokio::sync::broadcast::Receiver<runwarden_runtime::Change>,
) -> Decision {
    loop {
        let listed = f
            .store
            .decision_list(DecisionFilter {
                run_id: Some(run_id.into()),
                ..DecisionFilter::default()
            })
            .await
            .unwrap();
        if let Some(d) = listed.into_iter().next() {
            return d;
        }
        tokio::time::timeout(WAIT, feed.recv())
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn a_server_question_becomes_an_input_decision_and_the_answer_goes_back_to_the_call() {
    use runwarden_mcp::{ElicitationAnswer, Elicitor};
    let f = fixture().await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let mut feed = f.store.change_feed().subscribe();
    let asking = elicitor(&f, &run.id);
    let pending = tokio::spawn(async move { asking.elicit(question(WAIT)).await });
    let decision = asked(&f, &run.id, &mut feed).await;
    assert_eq!(decision.kind, DecisionKind::Input);
    assert!(decision.message.as_deref().unwrap().contains("which queue"));
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(
        row.status,
        RunState::Running,
        "the call is live: the run keeps its lease"
    );

    let bad = AnswerRequest {
        content: Some(json!({"queue": "facilities"})),
        ..reply(Answer::Accept)
    };
    let refused = answer(&f, &decision.id, bad).await;
    assert!(
        matches!(&refused, Err(DecideError::Invalid(m)) if m.contains("requested schema")),
        "content is checked against the server's schema: {refused:?}"
    );
    let good = AnswerRequest {
        content: Some(json!({"queue": "hardware"})),
        ..reply(Answer::Accept)
    };
    answer(&f, &decision.id, good).await.unwrap();
    let answered = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    let ElicitationAnswer::Accept(content) = answered else {
        panic!("the operator's content goes back: {answered:?}");
    };
    assert_eq!(content["queue"], "hardware");
}

#[tokio::test]
async fn a_server_question_nobody_answers_is_declined_after_its_timeout() {
    use runwarden_mcp::{ElicitationAnswer, Elicitor};
    let f = fixture().await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let started = std::time::Instant::now();
    let answered = tokio::time::timeout(
        WAIT,
        elicitor(&f, &run.id).elicit(question(Duration::from_millis(300))),
    )
    .await
    .unwrap();
    assert_eq!(answered, ElicitationAnswer::Decline);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited its timeout"
    );
    let listed = f
        .store
        .decision_list(DecisionFilter {
            run_id: Some(run.id.clone()),
            ..DecisionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed[0].status,
        DecisionStatus::Expired,
        "recorded as expired"
    );
    let late = answer(&f, &listed[0].id, reply(Answer::Decline)).await;
    assert!(matches!(late, Err(DecideError::Refused { .. })), "{late:?}");
}
