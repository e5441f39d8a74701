//! The `QueueStore` conformance checks: the worker's claim (R3), requeue and
//! dead-letter (R9), the reaper's rescue of stale runs and its race with a heartbeat (R9),
//! and what a cancel (R4) and a lost lease (R3) mean for both.
//!
//! The store decides nothing about retries: as in the runtime, each check reads the run,
//! decides with [`RetryPolicy::decide`], and hands the store the decision to apply. So the
//! checks prove both that the store applies what it is told and that its guard re-checks
//! what the decision read: a decision made on a row that changed since changes nothing.
//!
//! Claims and rescues look at every row of the store, so each check retires the runs it
//! leaves behind (a cancel: a cancelled run is never claimed or rescued) and the next check
//! starts from a store with nothing queued and nothing running.

use std::sync::Arc;
use std::time::Duration;

use runwarden_mcp::Effect;
use runwarden_runtime::queue::{
    Claim, Claimed, DeadLetter, QueueStore, RequeueAnswer, RequeueApply, RescueApply, Rescued,
};
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunSettle,
    SettleAnswer,
};
use runwarden_runtime::{Change, RequeueCause, RetryDecision, RetryPolicy, RunState, reap_at};
use serde_json::json;
use tokio::sync::broadcast;

mod claims;
mod feed;
mod reaper;
mod requeues;

use claims::*;
use feed::*;
use reaper::*;
use requeues::*;

/// The segment that holds the lease in these checks.
const OWNER: &str = "worker-a";
/// Another segment.
const OTHER: &str = "worker-b";

const T0: i64 = 1_700_000_000_000;
const LEASE: i64 = 30_000;
/// A generous budget, for checks about something else.
const BUDGET: u32 = 3;

/// Runs every check against `store`, which must be fresh and empty. Panics on the first
/// property that does not hold.
pub async fn exercise_queue_store(store: Arc<dyn QueueStore>) {
    let s = &*store;
    a_claim_takes_the_oldest_due_queued_run(s).await;
    a_run_is_claimed_exactly_once_by_concurrent_claimants(&store).await;
    a_run_not_yet_due_is_not_claimed(s).await;
    a_cancelled_queued_run_is_never_claimed(s).await;
    a_claim_with_its_history_answers_the_stored_events(s).await;
    a_claim_of_several_takes_the_oldest_due_runs_in_order(s).await;
    a_starting_claim_records_a_new_runs_start_once(s).await;

    requeue_puts_the_run_back_with_its_backoff_and_counts_the_attempt(s).await;
    a_graceful_requeue_does_not_spend_the_budget(s).await;
    requeue_beyond_the_budget_dead_letters_retries_exhausted(s).await;
    a_fenced_non_idempotent_write_is_dead_lettered_never_requeued(s).await;
    a_fenced_idempotent_write_may_be_requeued(s).await;
    a_run_without_a_stored_request_is_dead_lettered_not_retryable(s).await;
    requeue_after_a_cancel_answers_already_cancelled(s).await;
    requeue_by_a_lost_owner_changes_nothing(s).await;

    the_reaper_requeues_a_stale_run_and_dead_letters_a_fenced_one(s).await;
    the_reaper_backs_off_exponentially_and_spends_the_shared_budget(s).await;
    the_reaper_takes_at_most_limit_runs_oldest_lease_first(s).await;
    the_reaper_leaves_fresh_leases_alone(s).await;
    a_heartbeat_that_lands_first_wins_over_the_reaper(s).await;
    a_requeue_decided_on_a_row_that_changed_since_changes_nothing(s).await;
    a_rescue_decided_on_a_row_that_changed_since_is_skipped(s).await;
    two_reapers_deciding_on_one_stale_run_apply_exactly_once(&store).await;
    the_reaper_never_touches_a_cancelled_run(s).await;
    the_old_owner_cannot_append_after_the_reaper_took_the_run(s).await;

    committed_writes_are_published_on_the_feed(s).await;

    crate::keys::exercise(&store).await;
    crate::finals::exercise(&store).await;
    crate::epochs::exercise(&store).await;
}

fn queued_at(id: &str, created_ms: i64) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "helpdesk".into(),
        correlation: id.into(),
        request: Some(json!({"input": "file a ticket for the printer"})),
        status: NewRunStatus::Queued,
        now_ms: created_ms,
        origin: Default::default(),
    }
}

fn queued(id: &str) -> RunCreate {
    queued_at(id, T0)
}

/// A run claimed at birth by `owner` whose lease runs out at `lease_until_ms` (in the past
/// for a stale run).
fn running(id: &str, owner: &str, lease_until_ms: i64) -> RunCreate {
    RunCreate {
        status: NewRunStatus::Running {
            owner: owner.into(),
            lease_until_ms,
        },
        ..queued(id)
    }
}

async fn create(store: &dyn QueueStore, params: RunCreate) -> Run {
    store.run_create(params).await.expect("run_create")
}

async fn get(store: &dyn QueueStore, id: &str) -> Run {
    store
        .run_get(id)
        .await
        .expect("run_get")
        .unwrap_or_else(|| panic!("run {id} should exist"))
}

async fn claim(store: &dyn QueueStore, owner: &str, now_ms: i64) -> Option<Run> {
    store
        .run_claim(Claim {
            owner: owner.into(),
            lease_until_ms: now_ms + LEASE,
            now_ms,
            agents: None,
            start: false,
        })
        .await
        .expect("run_claim")
}

/// Claims the next due run and checks it is `id`.
async fn claim_expecting(store: &dyn QueueStore, id: &str, now_ms: i64) -> Run {
    let run = claim(store, OWNER, now_ms)
        .await
        .unwrap_or_else(|| panic!("run {id} should be claimable at {now_ms}"));
    assert_eq!(run.id, id, "the claim took another run");
    run
}

/// A segment's requeue in these checks. The runtime's policy decides on the row as read;
/// the due time of a requeue is fixed (`retry_at_ms`) so the checks can claim at a known
/// instant (the policy's backoff has its own tests in the runtime, and the reaper's is
/// checked here through [`reap_at`]).
struct Requeue {
    id: String,
    owner: String,
    reason: String,
    retry_at_ms: i64,
    counts: bool,
    max_requeues: u32,
    now_ms: i64,
}

fn requeue(id: &str, owner: &str, counts: bool, max_requeues: u32) -> Requeue {
    Requeue {
        id: id.into(),
        owner: owner.into(),
        reason: "the model answered 503".into(),
        retry_at_ms: T0 + 1_000,
        counts,
        max_requeues,
        now_ms: T0 + 10,
    }
}

/// Reads the run, decides with the runtime's policy, and applies the decision.
async fn requeued(store: &dyn QueueStore, params: Requeue) -> RequeueAnswer {
    let policy = RetryPolicy {
        max_requeues: params.max_requeues,
        ..RetryPolicy::default()
    };
    let cause = if params.counts {
        RequeueCause::Failure
    } else {
        RequeueCause::Drain
    };
    let read = store.run_get(&params.id).await.expect("run_get");
    let decision = match &read {
        Some(run) => policy.decide(run, cause, params.now_ms, 1.0),
        None => RetryDecision::Requeue { retry_at_ms: 0 },
    };
    let (decision, reason) = match decision {
        RetryDecision::Requeue { .. } => (
            RetryDecision::Requeue {
                retry_at_ms: params.retry_at_ms,
            },
            params.reason,
        ),
        RetryDecision::DeadLetter(code) => {
            (decision, format!("{}: {}", code.as_str(), params.reason))
        }
    };
    store
        .run_requeue_apply(RequeueApply {
            id: params.id,
            owner: params.owner,
            epoch: read.as_ref().map_or(0, |r| r.claim_epoch),
            requeue_count: read.as_ref().map_or(0, |r| r.requeue_count),
            pending_effect: read.and_then(|r| r.pending_effect),
            decision,
            reason,
            counts: params.counts,
            now_ms: params.now_ms,
        })
        .await
        .expect("run_requeue_apply")
}

async fn fence(store: &dyn QueueStore, id: &str, owner: &str, effect: Effect, until: i64) {
    let marked = store
        .run_fence_mark(FenceMark {
            id: id.into(),
            owner: owner.into(),
            epoch: crate::epoch_of(store, &id).await,
            effect: effect.as_str().into(),
            lease_until_ms: until,
            now_ms: until - LEASE,
        })
        .await
        .expect("run_fence_mark");
    assert!(marked, "the owner may mark its fence");
}

/// One reaper pass in these checks: the runtime's [`reap_at`] with a 100 ms base and full
/// jitter, so the delays are exactly 100, 200, 400, ... ms.
#[derive(Clone)]
struct Rescue {
    now_ms: i64,
    max_requeues: u32,
    backoff_base_ms: u64,
    limit: u32,
}

fn rescue(now_ms: i64, max_requeues: u32) -> Rescue {
    Rescue {
        now_ms,
        max_requeues,
        backoff_base_ms: 100,
        limit: 100,
    }
}

async fn rescued(store: &dyn QueueStore, params: Rescue) -> Vec<Rescued> {
    let policy = RetryPolicy {
        max_requeues: params.max_requeues,
        base: Duration::from_millis(params.backoff_base_ms),
        max: Duration::from_secs(3_600),
    };
    reap_at(store, &policy, params.now_ms, params.limit, Some(1.0))
        .await
        .expect("a reaper pass")
}

fn event(id: &str, owner: &str, epoch: i64) -> EventAppend {
    EventAppend {
        id: id.into(),
        owner: owner.into(),
        epoch,
        kind: "tool_executed".into(),
        payload: json!({}),
        clear_fence: true,
        round: None,
        end: None,
        now_ms: T0 + 50_000,
        before: None,
    }
}

fn settle(id: &str, owner: &str, epoch: i64) -> RunSettle {
    RunSettle {
        id: id.into(),
        owner: owner.into(),
        epoch,
        status: RunState::Completed,
        reason: "done".into(),
        now_ms: T0 + 50_000,
    }
}

/// Cancels every run a check leaves behind, so none of them is claimed or rescued later.
async fn retire(store: &dyn QueueStore, ids: &[&str]) {
    for id in ids {
        let answer = store.run_cancel(id, T0).await.expect("run_cancel");
        assert_ne!(answer, CancelAnswer::NotFound, "run {id} should exist");
    }
}
