//! The `RunStore` conformance checks: birth and the lease (R1, R3), the cancel (R4),
//! events and the boundary step after a cancel (R1, R5), the write fence (R7), settling,
//! and the status probe (R6).

use std::sync::Arc;

use runwarden_runtime::RunState;
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunFilter,
    RunOrigin, RunSettle, RunStore, SettleAnswer,
};
use serde_json::{Value, json};

mod births;
mod cancel;
mod events;
mod lease;
mod reads;
mod settle;
mod together;

use births::*;
use cancel::*;
use events::*;
use lease::*;
use reads::*;
use settle::*;
use together::*;

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
    a_run_keeps_who_started_it_and_its_tags(s).await;
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
    a_final_event_ends_a_run_only_as_completed_or_failed(s).await;
    an_answer_and_the_runs_end_are_stored_together_or_not_at_all(s).await;
    appends_side_by_side_keep_each_guard_and_each_answer(&store).await;

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
        origin: Default::default(),
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
        before: None,
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
