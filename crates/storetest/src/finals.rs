//! R8: every run ends with one final event, whoever ended it. The store writes it in the
//! transaction that ends a run no segment holds (a cancel while queued, the reaper's dead
//! letter) and never writes a second one.

use std::sync::Arc;

use runwarden_runtime::events::is_final_kind;
use runwarden_runtime::store::{EventAppend, NewRunStatus, RunCreate, RunEvent};
use runwarden_runtime::{CancelAnswer, QueueStore, RequeueAnswer, RetryPolicy, RunState, reap_at};
use serde_json::json;

/// Runs every check on a store whose earlier runs may still be stale: each check looks
/// only at its own runs.
pub(crate) async fn exercise(store: &Arc<dyn QueueStore>) {
    let s = &**store;
    a_cancel_while_queued_writes_the_final_event_with_it(s).await;
    a_cancel_of_a_running_run_leaves_the_final_event_to_its_segment(s).await;
    the_reapers_dead_letter_writes_the_final_event_and_its_requeue_none(s).await;
    a_run_with_a_final_event_never_gets_a_second(s).await;
    a_cancelled_run_whose_segment_died_gets_its_stop_from_the_reaper(s).await;
}

const OWNER: &str = "finals-owner";
const T0: i64 = 1_950_000_000_000;

fn create(id: &str, status: NewRunStatus, request: bool) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "finals".into(),
        correlation: id.into(),
        request: request.then(|| json!({"input": "file a ticket"})),
        status,
        now_ms: T0,
        origin: Default::default(),
    }
}

fn running(lease_until_ms: i64) -> NewRunStatus {
    NewRunStatus::Running {
        owner: OWNER.into(),
        lease_until_ms,
    }
}

async fn events(store: &dyn QueueStore, id: &str) -> Vec<RunEvent> {
    store.run_events(id, 0, 0).await.expect("events read")
}

fn finals(events: &[RunEvent]) -> Vec<&RunEvent> {
    events.iter().filter(|e| is_final_kind(&e.kind)).collect()
}

async fn a_cancel_while_queued_writes_the_final_event_with_it(store: &dyn QueueStore) {
    store
        .run_create(create("final-queued", NewRunStatus::Queued, true))
        .await
        .unwrap();
    let answer = store.run_cancel("final-queued", T0 + 10).await.unwrap();
    assert_eq!(
        answer,
        CancelAnswer::Cancelled {
            previous: RunState::Queued
        }
    );
    let log = events(store, "final-queued").await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].kind, "run_stopped");
    assert_eq!(log[0].payload["outcome"], "cancelled", "{:?}", log[0]);
    let reason = log[0].payload["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("while queued"), "{reason}");
    assert_eq!(log[0].time_ms, T0 + 10, "written with the cancel");
}

async fn a_cancel_of_a_running_run_leaves_the_final_event_to_its_segment(store: &dyn QueueStore) {
    store
        .run_create(create("final-running", running(T0 + 30_000), true))
        .await
        .unwrap();
    store.run_cancel("final-running", T0 + 10).await.unwrap();
    assert!(
        events(store, "final-running").await.is_empty(),
        "the segment records its boundary step and its stop"
    );
    let stop = EventAppend {
        id: "final-running".into(),
        owner: OWNER.into(),
        epoch: 1,
        kind: "run_stopped".into(),
        payload: json!({"outcome": "cancelled"}),
        clear_fence: false,
        round: None,
        end: None,
        now_ms: T0 + 20,
        before: None,
    };
    assert!(store.run_event_append(stop).await.unwrap().is_some());
}

async fn the_reapers_dead_letter_writes_the_final_event_and_its_requeue_none(
    store: &dyn QueueStore,
) {
    // No stored request: the reaper cannot retry it and dead-letters it.
    store
        .run_create(create("final-reaped-dead", running(T0 + 1_000), false))
        .await
        .unwrap();
    store
        .run_create(create("final-reaped-requeued", running(T0 + 1_000), true))
        .await
        .unwrap();
    let rescued = reap_at(store, &RetryPolicy::default(), T0 + 2_000, 1_000, Some(0.5))
        .await
        .unwrap();
    let action = |id: &str| {
        rescued
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.action)
            .unwrap_or_else(|| panic!("the reaper took {id}: {rescued:?}"))
    };
    assert!(matches!(
        action("final-reaped-dead"),
        RequeueAnswer::DeadLettered(_)
    ));
    assert!(matches!(
        action("final-reaped-requeued"),
        RequeueAnswer::Requeued { .. }
    ));

    let dead = events(store, "final-reaped-dead").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].kind, "run_failed");
    let reason = dead[0].payload["reason"].as_str().unwrap_or_default();
    let row = store.run_get("final-reaped-dead").await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed);
    assert_eq!(
        Some(reason),
        row.termination_reason.as_deref(),
        "the event says what the row says"
    );
    assert!(reason.starts_with("NOT_RETRYABLE"), "{reason}");
    assert!(
        finals(&events(store, "final-reaped-requeued").await).is_empty(),
        "a requeue is no end"
    );
}

async fn a_run_with_a_final_event_never_gets_a_second(store: &dyn QueueStore) {
    // The segment recorded its end, then died before settling the row.
    store
        .run_create(create("final-twice", running(T0 + 1_000), false))
        .await
        .unwrap();
    let end = EventAppend {
        id: "final-twice".into(),
        owner: OWNER.into(),
        epoch: 1,
        kind: "run_failed".into(),
        payload: json!({"reason": "the segment's own end"}),
        clear_fence: false,
        round: None,
        end: None,
        now_ms: T0 + 500,
        before: None,
    };
    store.run_event_append(end).await.unwrap().unwrap();
    reap_at(store, &RetryPolicy::default(), T0 + 2_000, 1_000, Some(0.5))
        .await
        .unwrap();
    let row = store.run_get("final-twice").await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Failed, "the reaper ended the row");
    let log = events(store, "final-twice").await;
    assert_eq!(finals(&log).len(), 1, "R8: one terminal event: {log:?}");
    assert_eq!(log[0].payload["reason"], "the segment's own end");
}

async fn a_cancelled_run_whose_segment_died_gets_its_stop_from_the_reaper(store: &dyn QueueStore) {
    let grace = runwarden_runtime::events::ORPHAN_GRACE_MS;
    // Cancelled while running; its segment died, so no `run_stopped` came.
    store
        .run_create(create("final-orphan", running(T0 + 1_000), true))
        .await
        .unwrap();
    store.run_cancel("final-orphan", T0 + 10).await.unwrap();
    // Cancelled while running; its segment recorded its own stop.
    store
        .run_create(create("final-stopped", running(T0 + 1_000), true))
        .await
        .unwrap();
    store.run_cancel("final-stopped", T0 + 10).await.unwrap();
    let stop = EventAppend {
        id: "final-stopped".into(),
        owner: OWNER.into(),
        epoch: 1,
        kind: "run_stopped".into(),
        payload: json!({"outcome": "cancelled"}),
        clear_fence: false,
        round: None,
        end: None,
        now_ms: T0 + 20,
        before: None,
    };
    store.run_event_append(stop).await.unwrap().unwrap();

    // Within the grace a live segment may still write its stop: nothing is written.
    reap_at(
        store,
        &RetryPolicy::default(),
        T0 + 1_000 + grace - 1,
        1_000,
        Some(0.5),
    )
    .await
    .unwrap();
    assert!(events(store, "final-orphan").await.is_empty());

    let now = T0 + 1_001 + grace;
    reap_at(store, &RetryPolicy::default(), now, 1_000, Some(0.5))
        .await
        .unwrap();
    let orphan = events(store, "final-orphan").await;
    assert_eq!(orphan.len(), 1, "{orphan:?}");
    assert_eq!(orphan[0].kind, "run_stopped");
    assert!(
        orphan[0].payload["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("ended before it recorded the stop"),
        "{:?}",
        orphan[0]
    );
    assert_eq!(
        finals(&events(store, "final-stopped").await).len(),
        1,
        "never a second"
    );
    let row = store.run_get("final-orphan").await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Cancelled, "still cancelled");
    assert_eq!(
        row.claimed_by.as_deref(),
        Some(OWNER),
        "the last holder stays on record"
    );

    // Looked at once: a later pass writes nothing more.
    reap_at(
        store,
        &RetryPolicy::default(),
        now + grace,
        1_000,
        Some(0.5),
    )
    .await
    .unwrap();
    assert_eq!(events(store, "final-orphan").await.len(), 1);
}
