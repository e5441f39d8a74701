//! Typed durable events: every payload the executor wrote before the types existed still
//! decodes and is written back byte for byte, and a resumed run whose log holds an event it
//! cannot read fails naming the run and the sequence, without calling anything.

use std::collections::BTreeSet;

use runwarden_mcp::Effect;
use runwarden_runtime::events::{EVENT_KINDS, EventBody, PROGRESS_KINDS};
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{
    CancelHub, Executor, ExecutorConfig, Outcome, RetryPolicy, RunState, RunStore, SegmentOptions,
    StatusWatcher, WatcherConfig,
};
use runwarden_testkit::{TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::fixture;

/// Events captured from the executor as it was before the types (commit 3bd4004), one per
/// shape it wrote: every kind, refused and executed tool steps, each delivery and outcome.
const CAPTURED: &str = include_str!("fixtures/events_v1_captured.jsonl");

#[test]
fn every_payload_the_executor_wrote_before_the_types_decodes_and_is_written_back_unchanged() {
    let mut kinds = BTreeSet::new();
    for (n, line) in CAPTURED.lines().enumerate() {
        let stored: Value = serde_json::from_str(line).unwrap();
        let kind = stored["kind"].as_str().unwrap();
        let payload = &stored["payload"];
        let body = EventBody::decode("captured", n as i64 + 1, kind, payload)
            .unwrap_or_else(|e| panic!("line {}: {e}", n + 1));
        assert_eq!(body.kind(), kind);
        // The one change since: a stop's outcome is written in the run statuses' words
        // (`CANCELLED` then, `cancelled` now); the old word still reads.
        let mut expected = payload.clone();
        if let Some(word) = expected["outcome"].as_str().map(str::to_lowercase) {
            expected["outcome"] = json!(word);
        }
        assert_eq!(
            body.to_payload(),
            expected,
            "line {}: the API answers the same JSON as before",
            n + 1
        );
        kinds.insert(kind.to_string());
    }
    // The progress and decision kinds came after the types: nothing before them wrote one.
    let every: BTreeSet<String> = EVENT_KINDS
        .iter()
        .filter(|k| !PROGRESS_KINDS.contains(k))
        .filter(|k| !k.starts_with("decision_"))
        .map(|k| k.to_string())
        .collect();
    assert_eq!(
        kinds, every,
        "the capture covers every kind the executor writes"
    );
}

async fn a_run_whose_log_holds(
    f: &crate::support::Fixture,
    second: (&str, Value),
) -> (runwarden_runtime::Run, TestServer) {
    let server = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    f.prior(
        &run.id,
        &[
            (
                "run_started",
                json!({"agent": "helper", "prompt": "go", "owner": "test-earlier"}),
            ),
            second,
        ],
    )
    .await;
    (run, server)
}

#[tokio::test]
async fn a_resumed_run_with_an_unknown_event_kind_fails_naming_the_run_and_sequence() {
    let f = fixture().await;
    let (run, mut server) = a_run_whose_log_holds(&f, ("tool_exploded", json!({}))).await;
    let plan =
        json!([{"tool_calls": [{"name": "srv__create", "arguments": {}}]}, {"text": "done"}]);
    let agent = f.agent(
        plan,
        vec![f.tool(&server.url("/mcp"), "create", Effect::NonIdempotentWrite)],
    );
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Failed
    );
    let row = f.store.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed);
    let reason = row.termination_reason.unwrap();
    assert!(
        reason.contains(&run.id) && reason.contains("event 2") && reason.contains("tool_exploded"),
        "the reason names the run, the sequence and the kind: {reason}"
    );
    assert_eq!(
        f.kinds(&run.id).await,
        ["run_started", "tool_exploded", "run_failed"],
        "nothing was resumed on a guess: no model call, no tool call"
    );
    assert!(
        server.drain_requests().is_empty(),
        "no byte reached the tool"
    );
}

#[tokio::test]
async fn a_queued_run_with_a_malformed_event_is_dead_lettered_not_retryable() {
    let f = fixture().await;
    let queue = (*f.store.inner).clone();
    let shared = std::sync::Arc::new(queue.clone());
    let watcher = StatusWatcher::new(
        shared.clone(),
        std::sync::Arc::new(CancelHub::new()),
        WatcherConfig::default(),
    );
    let executor = Executor::with_queue(shared, watcher, ExecutorConfig::new("worker"));
    let id = uuid::Uuid::now_v7().to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let run = queue
        .run_create(RunCreate {
            id: id.clone(),
            agent: "helper".into(),
            correlation: id.clone(),
            request: Some(json!({"prompt": "go"})),
            status: NewRunStatus::Running {
                owner: executor.owner().into(),
                lease_until_ms: now + 30_000,
            },
            now_ms: now,
            origin: Default::default(),
        })
        .await
        .unwrap();
    let secret_like = "the-user-prompt-must-not-travel-into-the-reason";
    // A model step without its tool calls: reading it as "no calls" would settle the run
    // as completed with a made-up final answer.
    let damaged = json!({"round": secret_like, "text": "ok"});
    for (kind, payload) in [
        (
            "run_started",
            json!({"agent": "helper", "prompt": "go", "owner": "w"}),
        ),
        ("model_response", damaged),
    ] {
        let epoch = queue
            .run_get(&id)
            .await
            .unwrap()
            .map_or(0, |r| r.claim_epoch);
        let append = runwarden_runtime::store::EventAppend {
            id: id.clone(),
            owner: executor.owner().into(),
            epoch,
            kind: kind.into(),
            payload,
            clear_fence: false,
            round: None,
            end: None,
            now_ms: now,
            before: None,
        };
        assert!(queue.run_event_append(append).await.unwrap().is_some());
    }
    let agent = f.agent(json!([{"text": "done"}]), vec![]);
    let options = SegmentOptions {
        retry: Some(RetryPolicy::default()),
        drain: None,
        history: None,
        started: None,
    };
    assert_eq!(
        executor
            .execute_with(&run, &agent, "go", None, &options)
            .await,
        Outcome::DeadLettered,
        "a damaged log does not heal on retry"
    );
    let row = queue.run_get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed);
    let reason = row.termination_reason.unwrap();
    assert!(reason.starts_with("NOT_RETRYABLE: "), "{reason}");
    assert!(
        reason.contains("event 2 (model_response)") && reason.contains(&id),
        "{reason}"
    );
    assert!(
        !reason.contains(secret_like),
        "stored values stay out of the reason: {reason}"
    );
}
