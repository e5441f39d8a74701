//! Claim epochs (fencing tokens) and the claim's agent filter: a segment of an older claim
//! of a run writes nothing, even under the same owner name as the claim that holds it now,
//! and a worker never claims a run of an agent it does not serve.

use std::sync::Arc;

use runwarden_runtime::decision::{Decision, DecisionAsk, DecisionKind, DecisionStatus};
use runwarden_runtime::queue::{Claim, QueueStore, RequeueAnswer, RequeueApply};
use runwarden_runtime::store::{
    EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunEnd, RunSettle,
    SettleAnswer,
};
use runwarden_runtime::{RetryDecision, RunState, check_row_matches_log};
use serde_json::json;

const OWNER: &str = "worker-epoch";
const AGENT: &str = "epoch-agent";
const T0: i64 = 1_700_000_500_000;
const LEASE: i64 = 30_000;

/// Runs the checks; part of `exercise_queue_store`.
pub(crate) async fn exercise(store: &Arc<dyn QueueStore>) {
    let s = &**store;
    a_claim_takes_only_runs_of_the_agents_it_serves(s).await;
    a_segment_of_an_older_claim_writes_nothing_under_the_same_owner(s).await;
    a_final_event_and_its_status_are_one_write_and_a_cancel_refuses_both(s).await;
}

fn queued(id: &str, agent: &str) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: agent.into(),
        correlation: id.into(),
        request: Some(json!({"prompt": "file a ticket"})),
        status: NewRunStatus::Queued,
        now_ms: T0,
        origin: Default::default(),
    }
}

async fn claim(store: &dyn QueueStore, now_ms: i64) -> Option<Run> {
    store
        .run_claim(Claim {
            owner: OWNER.into(),
            lease_until_ms: now_ms + LEASE,
            now_ms,
            agents: Some(vec![AGENT.into()]),
            start: false,
        })
        .await
        .expect("run_claim")
}

async fn a_claim_takes_only_runs_of_the_agents_it_serves(store: &dyn QueueStore) {
    store
        .run_create(queued("epoch-unknown-agent", "an-agent-no-worker-serves"))
        .await
        .unwrap();
    assert_eq!(
        claim(store, T0 + 1).await,
        None,
        "a worker never claims a run of an agent it does not know"
    );
    let row = store.run_get("epoch-unknown-agent").await.unwrap().unwrap();
    assert_eq!(
        row.status,
        RunState::Queued,
        "it waits for a worker that knows it"
    );
    store
        .run_cancel("epoch-unknown-agent", T0 + 2)
        .await
        .unwrap();
}

fn beat(run: &Run, epoch: i64) -> Heartbeat {
    Heartbeat {
        id: run.id.clone(),
        owner: OWNER.into(),
        epoch,
        lease_until_ms: T0 + 2 * LEASE,
        now_ms: T0 + 200,
    }
}

fn step(run: &Run, epoch: i64, end: Option<RunEnd>) -> EventAppend {
    EventAppend {
        id: run.id.clone(),
        owner: OWNER.into(),
        epoch,
        kind: if end.is_some() {
            "run_completed"
        } else {
            "tool_executed"
        }
        .into(),
        payload: json!({"reason": "done"}),
        clear_fence: true,
        round: None,
        end,
        now_ms: T0 + 200,
        before: None,
    }
}

async fn a_segment_of_an_older_claim_writes_nothing_under_the_same_owner(store: &dyn QueueStore) {
    store.run_create(queued("epoch-1", AGENT)).await.unwrap();
    let first = claim(store, T0 + 10).await.expect("the run is claimed");
    assert_eq!(first.claim_epoch, 1, "the first claim holds epoch 1");
    // The first claim's segment hands the run back; the same worker claims it again.
    let requeue = RequeueApply {
        id: first.id.clone(),
        owner: OWNER.into(),
        epoch: first.claim_epoch,
        requeue_count: 0,
        pending_effect: None,
        decision: RetryDecision::Requeue { retry_at_ms: T0 },
        reason: "the model answered 503".into(),
        counts: false,
        now_ms: T0 + 20,
    };
    let answer = store.run_requeue_apply(requeue.clone()).await.unwrap();
    assert!(
        matches!(answer, RequeueAnswer::Requeued { .. }),
        "{answer:?}"
    );
    let second = claim(store, T0 + 30).await.expect("claimed again");
    assert_eq!(
        second.claimed_by.as_deref(),
        Some(OWNER),
        "the same owner name"
    );
    assert!(
        second.claim_epoch > first.claim_epoch,
        "every claim raises the epoch"
    );
    let fence = a_ghost_writes_nothing(store, &first, &second, requeue).await;

    // The claim that holds the run now writes.
    let now = second.claim_epoch;
    assert!(store.run_heartbeat(beat(&second, now)).await.unwrap());
    assert!(
        store
            .run_fence_mark(FenceMark {
                epoch: now,
                ..fence
            })
            .await
            .unwrap()
    );
    let end = RunEnd {
        status: RunState::Completed,
        reason: "done".into(),
    };
    assert!(
        store
            .run_event_append(step(&second, now, Some(end)))
            .await
            .unwrap()
            .is_some()
    );
    let row = store.run_get("epoch-1").await.unwrap().unwrap();
    let kinds: Vec<String> = store
        .run_events("epoch-1", 0, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    check_row_matches_log("epoch-1", row.status, &kinds).unwrap();
    assert_eq!(row.status, RunState::Completed);
}

/// The segment of the older claim `first` (a ghost, under the same owner name as the
/// claim `second` that holds the run now) is refused everywhere and changes nothing.
/// Answers the ghost's fence mark, for the holder to try.
async fn a_ghost_writes_nothing(
    store: &dyn QueueStore,
    first: &Run,
    second: &Run,
    requeue: RequeueApply,
) -> FenceMark {
    let old = first.claim_epoch;
    let before = store.run_get("epoch-1").await.unwrap().unwrap();

    // The older claim's segment (a ghost) is refused everywhere.
    assert!(!store.run_heartbeat(beat(first, old)).await.unwrap());
    let fence = FenceMark {
        id: first.id.clone(),
        owner: OWNER.into(),
        epoch: old,
        effect: "non_idempotent_write".into(),
        lease_until_ms: T0 + 2 * LEASE,
        now_ms: T0 + 200,
    };
    assert!(!store.run_fence_mark(fence.clone()).await.unwrap());
    assert_eq!(
        store
            .run_event_append(step(first, old, None))
            .await
            .unwrap(),
        None
    );
    let settle = RunSettle {
        id: first.id.clone(),
        owner: OWNER.into(),
        epoch: old,
        status: RunState::Completed,
        reason: "done".into(),
        now_ms: T0 + 200,
    };
    assert_eq!(
        store.run_settle(settle.clone()).await.unwrap(),
        SettleAnswer::LeaseLost
    );
    let stale_requeue = RequeueApply {
        requeue_count: second.requeue_count,
        ..requeue
    };
    assert_eq!(
        store.run_requeue_apply(stale_requeue).await.unwrap(),
        RequeueAnswer::LeaseLost
    );
    let ask = DecisionAsk {
        decision: decision(&first.id),
        owner: OWNER.into(),
        epoch: old,
        event_payload: json!({"decision_id": "epoch-d1"}),
    };
    assert_eq!(store.decision_ask(ask).await.unwrap(), None);
    assert_eq!(
        store.run_get("epoch-1").await.unwrap().unwrap(),
        before,
        "an older claim's writes changed nothing"
    );
    assert!(store.run_events("epoch-1", 0, 0).await.unwrap().is_empty());
    fence
}

async fn a_final_event_and_its_status_are_one_write_and_a_cancel_refuses_both(
    store: &dyn QueueStore,
) {
    store.run_create(queued("epoch-race", AGENT)).await.unwrap();
    let run = claim(store, T0 + 40).await.expect("claimed");
    store.run_cancel("epoch-race", T0 + 50).await.unwrap();
    let end = RunEnd {
        status: RunState::Completed,
        reason: "done".into(),
    };
    assert_eq!(
        store
            .run_event_append(step(&run, run.claim_epoch, Some(end)))
            .await
            .unwrap(),
        None,
        "the cancel won the row: no completion is recorded"
    );
    // The segment records its stop instead: the winner's outcome.
    let stop = EventAppend {
        kind: "run_stopped".into(),
        payload: json!({"outcome": "cancelled"}),
        end: None,
        ..step(&run, run.claim_epoch, None)
    };
    assert!(store.run_event_append(stop).await.unwrap().is_some());
    let row = store.run_get("epoch-race").await.unwrap().unwrap();
    let kinds: Vec<String> = store
        .run_events("epoch-race", 0, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    check_row_matches_log("epoch-race", row.status, &kinds).unwrap();
}

fn decision(run_id: &str) -> Decision {
    Decision {
        id: "epoch-d1".into(),
        run_id: run_id.into(),
        kind: DecisionKind::Approval,
        round: 1,
        call_id: "c1".into(),
        tool: "srv__create".into(),
        arguments: json!({}),
        arguments_hash: "0".repeat(64),
        message: None,
        requested_schema: None,
        asked_ms: T0 + 200,
        expires_ms: T0 + 60_000,
        status: DecisionStatus::Pending,
        answer: None,
        reason: None,
        answer_arguments: None,
        content: None,
        actor: None,
        answered_ms: None,
        reissue: None,
        in_call: false,
    }
}
