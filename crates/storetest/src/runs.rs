//! The `RunStore` conformance checks: birth and the lease (R1, R3), the cancel (R4),
//! events and the boundary step after a cancel (R1, R5), the write fence (R7), settling,
//! and the status probe (R6).

use std::sync::Arc;

use runwarden_runtime::RunState;
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunFilter,
    RunSettle, RunStore, SettleAnswer,
};
use serde_json::{Value, json};

/// The segment that holds the lease in these checks.
const OWNER: &str = "segment-a";
/// A segment that does not hold it.
const OTHER: &str = "segment-b";
/// A write effect as the executor names it (R7).
const WRITE: &str = "non_idempotent_write";

/// Runs every check against `store`, which must be fresh and empty. Panics on the first
/// property that does not hold.
pub async fn exercise_run_store(store: Arc<dyn RunStore>) {
    let s = &*store;
    an_unknown_run_is_absent(s).await;
    a_synchronous_run_is_claimed_at_birth(s).await;
    a_queued_run_has_no_owner_and_keeps_its_request(s).await;
    a_run_id_is_used_once(s).await;

    cancel_moves_any_non_terminal_run_and_drops_the_request(s).await;
    cancelling_a_terminal_run_is_refused_with_its_state(s).await;
    cancelling_an_unknown_run_says_not_found(s).await;
    cancel_keeps_the_pending_effect(s).await;

    a_heartbeat_by_another_owner_is_refused(s).await;
    a_fence_mark_needs_the_lease_and_a_running_run(s).await;

    event_sequences_are_strictly_increasing_and_never_duplicated(&store).await;
    events_round_trip_and_page_by_sequence(s).await;
    an_event_from_a_lost_owner_is_refused_and_not_stored(s).await;
    the_owner_can_record_its_boundary_step_after_a_cancel(s).await;
    recording_a_write_step_clears_the_fence_but_not_on_a_cancelled_run(s).await;
    rounds_only_grow(s).await;

    settle_moves_a_running_run_to_completed_or_failed(s).await;
    settle_accepts_only_completed_or_failed(s).await;
    settle_is_refused_after_a_cancel_and_the_run_stays_cancelled(s).await;
    settle_by_a_lost_owner_changes_nothing(s).await;

    status_now_reads_the_current_status(s).await;

    the_list_is_newest_first_filtered_and_paged_by_cursor(s).await;
    counts_follow_every_transition(s).await;
    run_statuses_answers_many_runs_in_one_call(s).await;
}

const T0: i64 = 1_700_000_000_000;
const LEASE: i64 = 30_000;

fn running(id: &str) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "helpdesk".into(),
        correlation: id.into(),
        request: Some(json!({"input": "file a ticket for the printer"})),
        status: NewRunStatus::Running {
            owner: OWNER.into(),
            lease_until_ms: T0 + LEASE,
        },
        now_ms: T0,
    }
}

fn queued(id: &str) -> RunCreate {
    RunCreate {
        status: NewRunStatus::Queued,
        ..running(id)
    }
}

async fn create(store: &dyn RunStore, params: RunCreate) -> Run {
    store.run_create(params).await.expect("run_create")
}

async fn get(store: &dyn RunStore, id: &str) -> Run {
    store
        .run_get(id)
        .await
        .expect("run_get")
        .unwrap_or_else(|| panic!("run {id} should exist"))
}

async fn cancel(store: &dyn RunStore, id: &str, now_ms: i64) -> CancelAnswer {
    store.run_cancel(id, now_ms).await.expect("run_cancel")
}

fn heartbeat(id: &str, owner: &str, lease_until_ms: i64) -> Heartbeat {
    Heartbeat {
        id: id.into(),
        owner: owner.into(),
        epoch: 1,
        lease_until_ms,
        now_ms: lease_until_ms - LEASE,
    }
}

fn fence(id: &str, owner: &str, lease_until_ms: i64) -> FenceMark {
    FenceMark {
        id: id.into(),
        owner: owner.into(),
        epoch: 1,
        effect: WRITE.into(),
        lease_until_ms,
        now_ms: lease_until_ms - LEASE,
    }
}

async fn mark(store: &dyn RunStore, id: &str, owner: &str, lease_until_ms: i64) -> bool {
    store
        .run_fence_mark(fence(id, owner, lease_until_ms))
        .await
        .expect("run_fence_mark")
}

fn event(id: &str, owner: &str, kind: &str) -> EventAppend {
    EventAppend {
        id: id.into(),
        owner: owner.into(),
        epoch: 1,
        kind: kind.into(),
        payload: json!({"kind": kind}),
        clear_fence: false,
        round: None,
        end: None,
        now_ms: T0 + 1,
    }
}

async fn append(store: &dyn RunStore, params: EventAppend) -> Option<i64> {
    store
        .run_event_append(params)
        .await
        .expect("run_event_append")
}

async fn seqs(store: &dyn RunStore, id: &str) -> Vec<i64> {
    store
        .run_events(id, 0, 0)
        .await
        .expect("run_events")
        .iter()
        .map(|e| e.seq)
        .collect()
}

fn settle(id: &str, owner: &str, status: RunState) -> RunSettle {
    RunSettle {
        id: id.into(),
        owner: owner.into(),
        epoch: 1,
        status,
        reason: format!("{} by {owner}", status.as_str()),
        now_ms: T0 + 5,
    }
}

async fn settled(store: &dyn RunStore, params: RunSettle) -> SettleAnswer {
    store.run_settle(params).await.expect("run_settle")
}

/// One run's status through the batched read (R5's probe asks it with one id).
async fn status_now(store: &dyn RunStore, id: &str) -> Option<RunState> {
    let rows = store
        .run_statuses(&[id.to_string()])
        .await
        .expect("run_statuses");
    assert!(rows.len() <= 1, "one id, at most one row: {rows:?}");
    rows.into_iter()
        .find(|(row_id, _)| row_id == id)
        .map(|(_, status)| status)
}

async fn an_unknown_run_is_absent(store: &dyn RunStore) {
    assert_eq!(store.run_get("no-such-run").await.unwrap(), None);
    assert_eq!(status_now(store, "no-such-run").await, None);
    assert!(
        store
            .run_events("no-such-run", 0, 0)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_synchronous_run_is_claimed_at_birth(store: &dyn RunStore) {
    let created = create(store, running("sync-1")).await;
    let expected = Run {
        id: "sync-1".into(),
        agent: "helpdesk".into(),
        status: RunState::Running,
        termination_reason: None,
        request: Some(json!({"input": "file a ticket for the printer"})),
        claimed_by: Some(OWNER.into()),
        claim_epoch: 1,
        lease_expires_ms: Some(T0 + LEASE),
        pending_effect: None,
        requeue_count: 0,
        rounds: 0,
        correlation: "sync-1".into(),
        created_ms: T0,
        updated_ms: T0,
    };
    assert_eq!(
        created, expected,
        "R3: a synchronous run holds its lease at birth"
    );
    assert_eq!(
        get(store, "sync-1").await,
        expected,
        "the stored row is the returned run"
    );
    assert_eq!(status_now(store, "sync-1").await, Some(RunState::Running));
    assert!(
        seqs(store, "sync-1").await.is_empty(),
        "a new run has no events"
    );
}

async fn a_queued_run_has_no_owner_and_keeps_its_request(store: &dyn RunStore) {
    let request = json!({
        "input": "ünïcode \"quoted\" input\nover two lines",
        "attachments": [1, 2.5, null, true],
    });
    let created = create(
        store,
        RunCreate {
            request: Some(request.clone()),
            correlation: "corr-queued-1".into(),
            ..queued("queued-1")
        },
    )
    .await;
    assert_eq!(created.status, RunState::Queued);
    assert_eq!(created.claimed_by, None, "a queued run has no owner");
    assert_eq!(created.lease_expires_ms, None, "a queued run has no lease");
    assert_eq!(
        created.request,
        Some(request),
        "the stored request is kept for a worker"
    );
    assert_eq!(created.correlation, "corr-queued-1");
    assert_eq!(get(store, "queued-1").await, created);
    assert_eq!(status_now(store, "queued-1").await, Some(RunState::Queued));
}

async fn a_run_id_is_used_once(store: &dyn RunStore) {
    let first = create(store, queued("twice-1")).await;
    let again = RunCreate {
        agent: "another".into(),
        ..running("twice-1")
    };
    assert!(
        store.run_create(again).await.is_err(),
        "a second run with the same id is refused"
    );
    assert_eq!(
        get(store, "twice-1").await,
        first,
        "the first run is untouched"
    );
}

async fn cancel_moves_any_non_terminal_run_and_drops_the_request(store: &dyn RunStore) {
    for (id, params, previous) in [
        ("cancel-queued", queued("cancel-queued"), RunState::Queued),
        (
            "cancel-running",
            running("cancel-running"),
            RunState::Running,
        ),
    ] {
        let before = create(store, params).await;
        assert!(before.request.is_some());
        assert_eq!(
            cancel(store, id, T0 + 7).await,
            CancelAnswer::Cancelled { previous },
            "R4: a cancel answers the state it left"
        );
        let after = get(store, id).await;
        assert_eq!(after.status, RunState::Cancelled);
        assert_eq!(after.request, None, "R4: a cancel drops the stored request");
        assert!(
            after.termination_reason.is_some(),
            "a cancelled run says why it ended"
        );
        assert_eq!(after.updated_ms, T0 + 7);
        assert_eq!(after.created_ms, T0);
        assert_eq!(
            after.claimed_by, before.claimed_by,
            "the owner is kept so it can record its boundary step"
        );
        assert_eq!(status_now(store, id).await, Some(RunState::Cancelled));
    }
}

async fn cancelling_a_terminal_run_is_refused_with_its_state(store: &dyn RunStore) {
    create(store, running("terminal-completed")).await;
    create(store, running("terminal-failed")).await;
    create(store, queued("terminal-cancelled")).await;
    let settle_as = [
        ("terminal-completed", RunState::Completed),
        ("terminal-failed", RunState::Failed),
    ];
    for (id, status) in settle_as {
        assert_eq!(
            settled(store, settle(id, OWNER, status)).await,
            SettleAnswer::Settled
        );
    }
    cancel(store, "terminal-cancelled", T0 + 1).await;
    for (id, status) in [
        ("terminal-completed", RunState::Completed),
        ("terminal-failed", RunState::Failed),
        ("terminal-cancelled", RunState::Cancelled),
    ] {
        let before = get(store, id).await;
        assert_eq!(
            cancel(store, id, T0 + 99).await,
            CancelAnswer::AlreadyTerminal(status),
            "R4: a terminal run is refused with the state it is in"
        );
        assert_eq!(
            get(store, id).await,
            before,
            "a refused cancel changes nothing"
        );
    }
}

async fn cancelling_an_unknown_run_says_not_found(store: &dyn RunStore) {
    assert_eq!(
        cancel(store, "no-such-run", T0).await,
        CancelAnswer::NotFound
    );
    assert_eq!(
        store.run_get("no-such-run").await.unwrap(),
        None,
        "a cancel creates nothing"
    );
}

async fn cancel_keeps_the_pending_effect(store: &dyn RunStore) {
    create(store, running("cancel-fenced")).await;
    assert!(mark(store, "cancel-fenced", OWNER, T0 + 2 * LEASE).await);
    cancel(store, "cancel-fenced", T0 + 3).await;
    let run = get(store, "cancel-fenced").await;
    assert_eq!(run.status, RunState::Cancelled);
    assert_eq!(
        run.pending_effect.as_deref(),
        Some(WRITE),
        "R7: a cancelled mid-write run keeps its mark"
    );
    assert_eq!(run.claimed_by.as_deref(), Some(OWNER));
}

async fn a_heartbeat_by_another_owner_is_refused(store: &dyn RunStore) {
    let beat = |id: &'static str, owner: &'static str, until: i64| async move {
        store
            .run_heartbeat(heartbeat(id, owner, until))
            .await
            .expect("run_heartbeat")
    };
    create(store, running("beat-1")).await;
    assert!(
        beat("beat-1", OWNER, T0 + 2 * LEASE).await,
        "R3: the owner renews its lease"
    );
    let renewed = get(store, "beat-1").await;
    assert_eq!(renewed.lease_expires_ms, Some(T0 + 2 * LEASE));
    assert_eq!(renewed.updated_ms, T0 + LEASE);

    assert!(
        !beat("beat-1", OTHER, T0 + 9 * LEASE).await,
        "R3: another segment holds no lease"
    );
    assert_eq!(
        get(store, "beat-1").await,
        renewed,
        "a refused heartbeat changes nothing"
    );

    cancel(store, "beat-1", T0 + LEASE + 1).await;
    assert!(
        beat("beat-1", OWNER, T0 + 3 * LEASE).await,
        "the owner of a just-cancelled run keeps its lease until it stops"
    );

    create(store, queued("beat-queued")).await;
    assert!(
        !beat("beat-queued", OWNER, T0 + 2 * LEASE).await,
        "a queued run has no lease"
    );
    assert_eq!(get(store, "beat-queued").await.lease_expires_ms, None);

    create(store, running("beat-settled")).await;
    settled(store, settle("beat-settled", OWNER, RunState::Completed)).await;
    assert!(
        !beat("beat-settled", OWNER, T0 + 2 * LEASE).await,
        "a settled run has no lease"
    );
    assert!(!beat("no-such-run", OWNER, T0 + 2 * LEASE).await);
}

async fn a_fence_mark_needs_the_lease_and_a_running_run(store: &dyn RunStore) {
    create(store, running("fence-1")).await;
    assert!(
        !mark(store, "fence-1", OTHER, T0 + 2 * LEASE).await,
        "R7: no lease, no write"
    );
    let untouched = get(store, "fence-1").await;
    assert_eq!(untouched.pending_effect, None);
    assert_eq!(untouched.lease_expires_ms, Some(T0 + LEASE));

    assert!(mark(store, "fence-1", OWNER, T0 + 2 * LEASE).await);
    let marked = get(store, "fence-1").await;
    assert_eq!(
        marked.pending_effect.as_deref(),
        Some(WRITE),
        "R7: the effect is stamped"
    );
    assert_eq!(
        marked.lease_expires_ms,
        Some(T0 + 2 * LEASE),
        "R7: and the lease renewed"
    );
    assert_eq!(marked.updated_ms, T0 + LEASE);

    create(store, running("fence-cancelled")).await;
    cancel(store, "fence-cancelled", T0 + 1).await;
    assert!(
        !mark(store, "fence-cancelled", OWNER, T0 + 2 * LEASE).await,
        "R4: no write starts on a cancelled run"
    );
    assert_eq!(get(store, "fence-cancelled").await.pending_effect, None);

    create(store, queued("fence-queued")).await;
    assert!(!mark(store, "fence-queued", OWNER, T0 + 2 * LEASE).await);
    create(store, running("fence-settled")).await;
    settled(store, settle("fence-settled", OWNER, RunState::Failed)).await;
    assert!(!mark(store, "fence-settled", OWNER, T0 + 2 * LEASE).await);
    assert!(!mark(store, "no-such-run", OWNER, T0 + 2 * LEASE).await);
}

async fn event_sequences_are_strictly_increasing_and_never_duplicated(store: &Arc<dyn RunStore>) {
    const TASKS: i64 = 8;
    const APPENDS_PER_TASK: i64 = 10;
    let s = &**store;
    create(s, running("events-1")).await;
    create(s, running("events-2")).await;
    for expected in 1..=3 {
        assert_eq!(
            append(s, event("events-1", OWNER, "model_response")).await,
            Some(expected)
        );
    }
    assert_eq!(
        append(s, event("events-2", OWNER, "model_response")).await,
        Some(1),
        "each run counts its own events from 1"
    );

    create(s, running("events-concurrent")).await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = Arc::clone(store);
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..APPENDS_PER_TASK {
                let seq = append(&*store, event("events-concurrent", OWNER, "tool_executed")).await;
                got.push(seq.expect("the owner may append"));
            }
            got
        }));
    }
    let mut answered = Vec::new();
    for task in tasks {
        let got = task.await.expect("an appending task panicked");
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "one appender sees its sequences increase: {got:?}"
        );
        answered.extend(got);
    }
    answered.sort_unstable();
    let all: Vec<i64> = (1..=TASKS * APPENDS_PER_TASK).collect();
    assert_eq!(
        answered, all,
        "R1: concurrent appends answer 1..=N, each once"
    );
    assert_eq!(
        seqs(s, "events-concurrent").await,
        all,
        "R1: and store exactly those"
    );
    assert_eq!(seqs(s, "events-1").await, [1, 2, 3]);
}

async fn events_round_trip_and_page_by_sequence(store: &dyn RunStore) {
    create(store, running("page-1")).await;
    let payloads: Vec<Value> = vec![
        json!({"text": "ünïcode \"quoted\"\nline", "n": 1}),
        json!([1, 2.5, null, true]),
        json!("a bare string"),
        json!({"nested": {"deep": [{"x": -1}]}}),
    ];
    for (n, payload) in payloads.iter().enumerate() {
        let params = EventAppend {
            payload: payload.clone(),
            kind: format!("kind_{n}"),
            now_ms: T0 + 10 + i64::try_from(n).unwrap(),
            ..event("page-1", OWNER, "")
        };
        append(store, params).await.expect("the owner may append");
    }
    let all = store.run_events("page-1", 0, 0).await.unwrap();
    assert_eq!(all.len(), payloads.len(), "limit 0 returns every event");
    for (n, (got, payload)) in all.iter().zip(&payloads).enumerate() {
        let n64 = i64::try_from(n).unwrap();
        assert_eq!(got.run_id, "page-1");
        assert_eq!(got.seq, n64 + 1);
        assert_eq!(got.kind, format!("kind_{n}"));
        assert_eq!(
            &got.payload, payload,
            "every payload comes back as it was stored"
        );
        assert_eq!(got.time_ms, T0 + 10 + n64);
    }
    let page: Vec<i64> = store
        .run_events("page-1", 1, 2)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        page,
        [2, 3],
        "after_seq is exclusive, limit caps, oldest first"
    );
    assert!(store.run_events("page-1", 4, 0).await.unwrap().is_empty());
}

async fn an_event_from_a_lost_owner_is_refused_and_not_stored(store: &dyn RunStore) {
    create(store, running("lost-1")).await;
    append(store, event("lost-1", OWNER, "model_response")).await;
    let before = get(store, "lost-1").await;
    let refused = EventAppend {
        round: Some(9),
        ..event("lost-1", OTHER, "tool_executed")
    };
    assert_eq!(
        append(store, refused).await,
        None,
        "R3: a segment without the lease is refused"
    );
    assert_eq!(
        seqs(store, "lost-1").await,
        [1],
        "a refused event is not stored"
    );
    assert_eq!(
        get(store, "lost-1").await,
        before,
        "a refused event changes nothing"
    );

    create(store, queued("lost-queued")).await;
    assert_eq!(
        append(store, event("lost-queued", OWNER, "model_response")).await,
        None
    );
    create(store, running("lost-settled")).await;
    settled(store, settle("lost-settled", OWNER, RunState::Completed)).await;
    assert_eq!(
        append(store, event("lost-settled", OWNER, "model_response")).await,
        None
    );
    assert!(seqs(store, "lost-settled").await.is_empty());
    assert_eq!(
        append(store, event("no-such-run", OWNER, "model_response")).await,
        None
    );
}

async fn the_owner_can_record_its_boundary_step_after_a_cancel(store: &dyn RunStore) {
    create(store, running("boundary-1")).await;
    append(store, event("boundary-1", OWNER, "model_response")).await;
    cancel(store, "boundary-1", T0 + 2).await;
    assert_eq!(
        append(store, event("boundary-1", OWNER, "tool_executed")).await,
        Some(2),
        "R5: the owner persists the boundary step of a cancelled run"
    );
    assert_eq!(
        append(store, event("boundary-1", OTHER, "tool_executed")).await,
        None,
        "but nobody else may"
    );
    assert_eq!(get(store, "boundary-1").await.status, RunState::Cancelled);
}

async fn recording_a_write_step_clears_the_fence_but_not_on_a_cancelled_run(store: &dyn RunStore) {
    create(store, running("write-1")).await;
    assert!(mark(store, "write-1", OWNER, T0 + 2 * LEASE).await);
    append(store, event("write-1", OWNER, "model_response")).await;
    assert_eq!(
        get(store, "write-1").await.pending_effect.as_deref(),
        Some(WRITE),
        "an event recorded without clear_fence keeps the mark"
    );
    let lost = EventAppend {
        clear_fence: true,
        ..event("write-1", OTHER, "tool_executed")
    };
    assert_eq!(append(store, lost).await, None);
    assert_eq!(
        get(store, "write-1").await.pending_effect.as_deref(),
        Some(WRITE),
        "a refused append clears nothing"
    );
    let recorded = EventAppend {
        clear_fence: true,
        ..event("write-1", OWNER, "tool_executed")
    };
    assert_eq!(append(store, recorded).await, Some(2));
    assert_eq!(
        get(store, "write-1").await.pending_effect,
        None,
        "R7: recording the write step clears the fence"
    );

    create(store, running("write-cancelled")).await;
    assert!(mark(store, "write-cancelled", OWNER, T0 + 2 * LEASE).await);
    cancel(store, "write-cancelled", T0 + 3).await;
    let boundary = EventAppend {
        clear_fence: true,
        ..event("write-cancelled", OWNER, "tool_executed")
    };
    assert_eq!(
        append(store, boundary).await,
        Some(1),
        "the boundary step is recorded"
    );
    assert_eq!(
        get(store, "write-cancelled")
            .await
            .pending_effect
            .as_deref(),
        Some(WRITE),
        "R7: a cancelled mid-write run keeps its mark"
    );
}

async fn rounds_only_grow(store: &dyn RunStore) {
    create(store, running("rounds-1")).await;
    for (round, expected) in [(Some(3), 3), (Some(1), 3), (None, 3), (Some(5), 5)] {
        let params = EventAppend {
            round,
            ..event("rounds-1", OWNER, "model_response")
        };
        append(store, params).await.expect("the owner may append");
        assert_eq!(
            get(store, "rounds-1").await.rounds,
            expected,
            "after round {round:?}"
        );
    }
}

async fn settle_moves_a_running_run_to_completed_or_failed(store: &dyn RunStore) {
    for (id, status) in [
        ("settle-ok", RunState::Completed),
        ("settle-failed", RunState::Failed),
    ] {
        let before = create(store, running(id)).await;
        assert_eq!(
            settled(store, settle(id, OWNER, status)).await,
            SettleAnswer::Settled
        );
        let after = get(store, id).await;
        assert_eq!(after.status, status);
        assert_eq!(
            after.termination_reason,
            Some(format!("{} by {OWNER}", status.as_str()))
        );
        assert_eq!(after.updated_ms, T0 + 5);
        assert_eq!(after.claimed_by, before.claimed_by);
        assert_eq!(
            settled(store, settle(id, OWNER, RunState::Completed)).await,
            SettleAnswer::LeaseLost,
            "a terminal run is never settled twice"
        );
        assert_eq!(get(store, id).await, after);
    }
}

async fn settle_accepts_only_completed_or_failed(store: &dyn RunStore) {
    create(store, running("settle-odd")).await;
    for status in [
        RunState::Queued,
        RunState::Running,
        RunState::WaitingForApproval,
        RunState::Cancelled,
    ] {
        assert!(
            store
                .run_settle(settle("settle-odd", OWNER, status))
                .await
                .is_err(),
            "settling as {} is refused",
            status.as_str()
        );
    }
    assert_eq!(get(store, "settle-odd").await.status, RunState::Running);
}

async fn settle_is_refused_after_a_cancel_and_the_run_stays_cancelled(store: &dyn RunStore) {
    create(store, running("settle-cancelled")).await;
    cancel(store, "settle-cancelled", T0 + 1).await;
    let cancelled = get(store, "settle-cancelled").await;
    for status in [RunState::Completed, RunState::Failed] {
        assert_eq!(
            settled(store, settle("settle-cancelled", OWNER, status)).await,
            SettleAnswer::AlreadyCancelled,
            "R4: the cancel won the row"
        );
    }
    assert_eq!(
        get(store, "settle-cancelled").await,
        cancelled,
        "the run stays cancelled, reason and all"
    );
}

async fn settle_by_a_lost_owner_changes_nothing(store: &dyn RunStore) {
    let before = create(store, running("settle-lost")).await;
    assert_eq!(
        settled(store, settle("settle-lost", OTHER, RunState::Completed)).await,
        SettleAnswer::LeaseLost,
        "R3: a segment without the lease settles nothing"
    );
    assert_eq!(get(store, "settle-lost").await, before);

    let queued_run = create(store, queued("settle-queued")).await;
    assert_eq!(
        settled(store, settle("settle-queued", OWNER, RunState::Failed)).await,
        SettleAnswer::LeaseLost,
        "a queued run is not held by anyone"
    );
    assert_eq!(get(store, "settle-queued").await, queued_run);
    assert_eq!(
        settled(store, settle("no-such-run", OWNER, RunState::Failed)).await,
        SettleAnswer::LeaseLost
    );
    assert_eq!(store.run_get("no-such-run").await.unwrap(), None);
}

async fn status_now_reads_the_current_status(store: &dyn RunStore) {
    assert_eq!(status_now(store, "status-1").await, None);
    create(store, queued("status-1")).await;
    assert_eq!(status_now(store, "status-1").await, Some(RunState::Queued));
    cancel(store, "status-1", T0 + 1).await;
    assert_eq!(
        status_now(store, "status-1").await,
        Some(RunState::Cancelled),
        "R6: the probe sees a cancel as soon as it is committed"
    );

    create(store, running("status-2")).await;
    assert_eq!(status_now(store, "status-2").await, Some(RunState::Running));
    settled(store, settle("status-2", OWNER, RunState::Failed)).await;
    assert_eq!(status_now(store, "status-2").await, Some(RunState::Failed));
}

async fn the_list_is_newest_first_filtered_and_paged_by_cursor(store: &dyn RunStore) {
    // UUIDv7-shaped ids in creation order, under an agent no other check uses.
    let ids: Vec<String> = (1..=5)
        .map(|n| format!("01900000-0000-7000-8000-0000000list{n}"))
        .collect();
    for (n, id) in ids.iter().enumerate() {
        let mut params = if n % 2 == 0 { queued(id) } else { running(id) };
        params.agent = "lister".into();
        create(store, params).await;
    }
    let list = |filter: RunFilter| async move {
        store
            .run_list(filter)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    let all = list(RunFilter {
        agent: Some("lister".into()),
        ..RunFilter::default()
    })
    .await;
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(all, newest_first);
    let first_page = list(RunFilter {
        agent: Some("lister".into()),
        limit: 2,
        ..RunFilter::default()
    })
    .await;
    assert_eq!(first_page, newest_first[..2]);
    let second_page = list(RunFilter {
        agent: Some("lister".into()),
        limit: 2,
        before_id: first_page.last().cloned(),
        ..RunFilter::default()
    })
    .await;
    assert_eq!(
        second_page,
        newest_first[2..4],
        "the cursor continues without gaps or repeats"
    );
    let queued_only = list(RunFilter {
        agent: Some("lister".into()),
        status: Some(RunState::Queued),
        ..RunFilter::default()
    })
    .await;
    assert_eq!(
        queued_only,
        [ids[4].clone(), ids[2].clone(), ids[0].clone()]
    );
}

async fn counts_follow_every_transition(store: &dyn RunStore) {
    let count = |counts: &[(RunState, u64)], state: RunState| {
        counts
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    };
    let before = store.run_counts().await.unwrap();
    let id = "01900000-0000-7000-8000-00000000cnt1";
    create(store, queued(id)).await;
    let queued_now = store.run_counts().await.unwrap();
    assert_eq!(
        count(&queued_now, RunState::Queued),
        count(&before, RunState::Queued) + 1
    );
    cancel(store, id, T0).await;
    let after = store.run_counts().await.unwrap();
    assert_eq!(
        count(&after, RunState::Queued),
        count(&before, RunState::Queued)
    );
    assert_eq!(
        count(&after, RunState::Cancelled),
        count(&before, RunState::Cancelled) + 1
    );
}

/// R6 (amended): the status watcher's batched read answers every known run of the list in
/// one call and leaves out ids with no run.
async fn run_statuses_answers_many_runs_in_one_call(store: &dyn RunStore) {
    create(store, running("statuses-running")).await;
    create(store, queued("statuses-queued")).await;
    create(store, running("statuses-cancelled")).await;
    cancel(store, "statuses-cancelled", T0 + 1).await;
    let ids: Vec<String> = [
        "statuses-running",
        "statuses-queued",
        "statuses-cancelled",
        "statuses-unknown",
    ]
    .map(String::from)
    .to_vec();
    let mut statuses = store.run_statuses(&ids).await.expect("run_statuses");
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        statuses,
        vec![
            ("statuses-cancelled".to_owned(), RunState::Cancelled),
            ("statuses-queued".to_owned(), RunState::Queued),
            ("statuses-running".to_owned(), RunState::Running),
        ],
        "one answer per known run, none for an unknown id"
    );
    assert!(
        store
            .run_statuses(&[])
            .await
            .expect("run_statuses of nothing")
            .is_empty()
    );
}
