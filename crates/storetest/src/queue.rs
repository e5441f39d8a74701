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
    Claim, DeadLetter, QueueStore, RequeueAnswer, RequeueApply, RescueApply, Rescued,
};
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, NewRunStatus, Run, RunCreate, RunSettle,
    SettleAnswer,
};
use runwarden_runtime::{Change, RequeueCause, RetryDecision, RetryPolicy, RunState, reap_at};
use serde_json::json;
use tokio::sync::broadcast;

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

async fn a_claim_takes_the_oldest_due_queued_run(store: &dyn QueueStore) {
    create(store, queued_at("oldest-new", T0 + 20)).await;
    create(store, queued_at("oldest-old", T0 + 10)).await;
    create(store, queued_at("oldest-mid", T0 + 15)).await;
    // Created in the same millisecond: the id breaks the tie.
    create(store, queued_at("oldest-tie-b", T0 + 30)).await;
    create(store, queued_at("oldest-tie-a", T0 + 30)).await;
    // Older than all of them, but already running: not for a worker.
    create(store, running("oldest-running", OTHER, T0 + 9 * LEASE)).await;

    let now = T0 + 100;
    let first = claim_expecting(store, "oldest-old", now).await;
    assert_eq!(first.status, RunState::Running, "R3: queued -> running");
    assert_eq!(
        first.claimed_by.as_deref(),
        Some(OWNER),
        "R3: the claimant holds it"
    );
    assert_eq!(
        first.lease_expires_ms,
        Some(now + LEASE),
        "R3: with its first lease"
    );
    assert_eq!(first.updated_ms, now);
    assert_eq!(first.created_ms, T0 + 10);
    assert_eq!(first.termination_reason, None);
    assert_eq!(
        first.request,
        Some(json!({"input": "file a ticket for the printer"})),
        "the worker gets the stored request"
    );
    assert_eq!(
        get(store, "oldest-old").await,
        first,
        "the claim answers the stored row"
    );
    for id in ["oldest-mid", "oldest-new", "oldest-tie-a", "oldest-tie-b"] {
        claim_expecting(store, id, now).await;
    }
    assert_eq!(
        claim(store, OWNER, now).await,
        None,
        "nothing left to claim"
    );
    assert_eq!(
        get(store, "oldest-running").await.claimed_by.as_deref(),
        Some(OTHER),
        "a running run is never claimed"
    );
    retire(
        store,
        &[
            "oldest-new",
            "oldest-old",
            "oldest-mid",
            "oldest-tie-a",
            "oldest-tie-b",
            "oldest-running",
        ],
    )
    .await;
}

async fn a_run_is_claimed_exactly_once_by_concurrent_claimants(store: &Arc<dyn QueueStore>) {
    const CLAIMANTS: usize = 16;
    let ids = ["race-1", "race-2", "race-3", "race-4", "race-5"];
    for id in ids {
        create(&**store, queued(id)).await;
    }
    let mut tasks = Vec::new();
    for n in 0..CLAIMANTS {
        let store = Arc::clone(store);
        tasks.push(tokio::spawn(async move {
            let owner = format!("claimant-{n}");
            let mut won = Vec::new();
            while let Some(run) = claim(&*store, &owner, T0 + 100).await {
                assert_eq!(run.claimed_by.as_deref(), Some(owner.as_str()));
                won.push(run.id);
            }
            (owner, won)
        }));
    }
    let mut claimed = Vec::new();
    for task in tasks {
        let (owner, won) = task.await.expect("a claiming task panicked");
        for id in won {
            assert_eq!(
                get(&**store, &id).await.claimed_by.as_deref(),
                Some(owner.as_str()),
                "the stored owner is the claimant that was told it won"
            );
            claimed.push(id);
        }
    }
    claimed.sort_unstable();
    assert_eq!(claimed, ids, "R3: every run is claimed, each exactly once");
    retire(&**store, &ids).await;
}

async fn a_run_not_yet_due_is_not_claimed(store: &dyn QueueStore) {
    create(store, queued("due-1")).await;
    claim_expecting(store, "due-1", T0).await;
    let later = Requeue {
        retry_at_ms: T0 + 5_000,
        ..requeue("due-1", OWNER, true, BUDGET)
    };
    assert_eq!(
        requeued(store, later).await,
        RequeueAnswer::Requeued { requeue_count: 1 }
    );
    assert_eq!(
        claim(store, OWNER, T0 + 4_999).await,
        None,
        "R9: a run waits out its backoff"
    );
    assert_eq!(get(store, "due-1").await.status, RunState::Queued);
    claim_expecting(store, "due-1", T0 + 5_000).await;
    retire(store, &["due-1"]).await;
}

async fn a_cancelled_queued_run_is_never_claimed(store: &dyn QueueStore) {
    create(store, queued("cancelled-queued")).await;
    store.run_cancel("cancelled-queued", T0 + 1).await.unwrap();
    let cancelled = get(store, "cancelled-queued").await;
    assert_eq!(
        claim(store, OWNER, T0 + 100).await,
        None,
        "R4: a cancelled run is never claimed"
    );
    assert_eq!(get(store, "cancelled-queued").await, cancelled);
}

async fn requeue_puts_the_run_back_with_its_backoff_and_counts_the_attempt(store: &dyn QueueStore) {
    create(store, queued("requeue-1")).await;
    let claimed = claim_expecting(store, "requeue-1", T0).await;
    assert_eq!(
        requeued(store, requeue("requeue-1", OWNER, true, BUDGET)).await,
        RequeueAnswer::Requeued { requeue_count: 1 },
        "R9: a retryable failure goes back to the queue"
    );
    let back = get(store, "requeue-1").await;
    assert_eq!(back.status, RunState::Queued);
    assert_eq!(back.claimed_by, None, "nobody holds a queued run");
    assert_eq!(back.lease_expires_ms, None);
    assert_eq!(back.requeue_count, 1, "R9: the attempt is counted");
    assert_eq!(
        back.termination_reason.as_deref(),
        Some("the model answered 503")
    );
    assert_eq!(
        back.request, claimed.request,
        "the request stays for the next attempt"
    );
    assert_eq!(back.updated_ms, T0 + 10);

    assert_eq!(
        claim(store, OWNER, T0 + 999).await,
        None,
        "R9: not before its retry"
    );
    let again = claim_expecting(store, "requeue-1", T0 + 1_000).await;
    assert_eq!(again.requeue_count, 1, "a claim does not count an attempt");
    assert_eq!(
        again.termination_reason, None,
        "a claimed run has no termination reason"
    );
    assert_eq!(
        requeued(store, requeue("requeue-1", OWNER, true, BUDGET)).await,
        RequeueAnswer::Requeued { requeue_count: 2 }
    );
    assert_eq!(get(store, "requeue-1").await.requeue_count, 2);
    retire(store, &["requeue-1"]).await;
}

async fn a_graceful_requeue_does_not_spend_the_budget(store: &dyn QueueStore) {
    create(store, queued("graceful-1")).await;
    for _ in 0..3 {
        claim_expecting(store, "graceful-1", T0 + 1_000).await;
        assert_eq!(
            requeued(store, requeue("graceful-1", OWNER, false, 0)).await,
            RequeueAnswer::Requeued { requeue_count: 0 },
            "a graceful stop is not a failed attempt, even with no budget"
        );
    }
    let back = get(store, "graceful-1").await;
    assert_eq!(back.status, RunState::Queued);
    assert_eq!(back.requeue_count, 0);
    retire(store, &["graceful-1"]).await;
}

async fn requeue_beyond_the_budget_dead_letters_retries_exhausted(store: &dyn QueueStore) {
    create(store, queued("budget-1")).await;
    for expected in 1..=2 {
        claim_expecting(store, "budget-1", T0 + 1_000).await;
        assert_eq!(
            requeued(store, requeue("budget-1", OWNER, true, 2)).await,
            RequeueAnswer::Requeued {
                requeue_count: expected
            }
        );
    }
    let last = claim_expecting(store, "budget-1", T0 + 1_000).await;
    assert_eq!(
        requeued(store, requeue("budget-1", OWNER, true, 2)).await,
        RequeueAnswer::DeadLettered(DeadLetter::RetriesExhausted),
        "R9: at most max_requeues requeues, then dead-letter"
    );
    let dead = get(store, "budget-1").await;
    assert_eq!(
        dead.status,
        RunState::Failed,
        "R9: a dead letter is a failed run"
    );
    assert_eq!(
        dead.termination_reason.as_deref(),
        Some("RETRIES_EXHAUSTED: the model answered 503"),
        "R9: the reason starts with its code and says why"
    );
    assert_eq!(dead.requeue_count, 2);
    assert_eq!(
        dead.claimed_by, last.claimed_by,
        "the record shows the last owner"
    );
    assert_eq!(dead.updated_ms, T0 + 10);
    assert_eq!(
        claim(store, OWNER, T0 + 9_000).await,
        None,
        "a dead letter is never claimed"
    );
    assert_eq!(
        requeued(store, requeue("budget-1", OWNER, true, 2)).await,
        RequeueAnswer::LeaseLost,
        "a failed run is held by nobody"
    );
    assert_eq!(get(store, "budget-1").await, dead);
}

async fn a_fenced_non_idempotent_write_is_dead_lettered_never_requeued(store: &dyn QueueStore) {
    for (id, counts) in [("fenced-failure", true), ("fenced-graceful", false)] {
        create(store, queued(id)).await;
        claim_expecting(store, id, T0).await;
        fence(store, id, OWNER, Effect::NonIdempotentWrite, T0 + LEASE).await;
        assert_eq!(
            requeued(store, requeue(id, OWNER, counts, 1_000)).await,
            RequeueAnswer::DeadLettered(DeadLetter::FencedWrite),
            "R9: a write that may have run is never retried, whatever the budget"
        );
        let dead = get(store, id).await;
        assert_eq!(dead.status, RunState::Failed);
        assert!(
            dead.termination_reason
                .as_deref()
                .is_some_and(|r| r.starts_with("FENCED_WRITE: ")),
            "{:?}",
            dead.termination_reason
        );
        assert_eq!(
            dead.pending_effect.as_deref(),
            Some(Effect::NonIdempotentWrite.as_str()),
            "R7: the record keeps the mark of the write in flight"
        );
        assert_eq!(dead.requeue_count, 0);
    }
    assert_eq!(claim(store, OWNER, T0 + 9_000).await, None);
}

async fn a_fenced_idempotent_write_may_be_requeued(store: &dyn QueueStore) {
    create(store, queued("idempotent-1")).await;
    claim_expecting(store, "idempotent-1", T0).await;
    fence(
        store,
        "idempotent-1",
        OWNER,
        Effect::IdempotentWrite,
        T0 + LEASE,
    )
    .await;
    assert_eq!(
        requeued(store, requeue("idempotent-1", OWNER, true, BUDGET)).await,
        RequeueAnswer::Requeued { requeue_count: 1 },
        "R9: repeating an idempotent write is safe"
    );
    assert_eq!(get(store, "idempotent-1").await.status, RunState::Queued);
    retire(store, &["idempotent-1"]).await;
}

async fn a_run_without_a_stored_request_is_dead_lettered_not_retryable(store: &dyn QueueStore) {
    for (id, counts) in [("no-request-failure", true), ("no-request-graceful", false)] {
        create(
            store,
            RunCreate {
                request: None,
                ..running(id, OWNER, T0 + LEASE)
            },
        )
        .await;
        assert_eq!(
            requeued(store, requeue(id, OWNER, counts, BUDGET)).await,
            RequeueAnswer::DeadLettered(DeadLetter::NotRetryable),
            "R9: nothing to retry from"
        );
        let dead = get(store, id).await;
        assert_eq!(dead.status, RunState::Failed);
        assert_eq!(
            dead.termination_reason.as_deref(),
            Some("NOT_RETRYABLE: the model answered 503")
        );
    }
}

async fn requeue_after_a_cancel_answers_already_cancelled(store: &dyn QueueStore) {
    create(store, queued("requeue-cancelled")).await;
    claim_expecting(store, "requeue-cancelled", T0).await;
    store.run_cancel("requeue-cancelled", T0 + 5).await.unwrap();
    let cancelled = get(store, "requeue-cancelled").await;
    for counts in [true, false] {
        assert_eq!(
            requeued(store, requeue("requeue-cancelled", OWNER, counts, BUDGET)).await,
            RequeueAnswer::AlreadyCancelled,
            "R4: no retry path takes a cancelled run"
        );
    }
    assert_eq!(get(store, "requeue-cancelled").await, cancelled);
    assert_eq!(claim(store, OWNER, T0 + 9_000).await, None);
}

async fn requeue_by_a_lost_owner_changes_nothing(store: &dyn QueueStore) {
    create(store, running("requeue-lost", OWNER, T0 + LEASE)).await;
    fence(
        store,
        "requeue-lost",
        OWNER,
        Effect::NonIdempotentWrite,
        T0 + LEASE,
    )
    .await;
    let held = get(store, "requeue-lost").await;
    assert_eq!(
        requeued(store, requeue("requeue-lost", OTHER, true, BUDGET)).await,
        RequeueAnswer::LeaseLost,
        "R3: only the lease holder requeues, or dead-letters"
    );
    assert_eq!(get(store, "requeue-lost").await, held);

    let waiting = create(store, queued("requeue-queued")).await;
    assert_eq!(
        requeued(store, requeue("requeue-queued", OWNER, true, BUDGET)).await,
        RequeueAnswer::LeaseLost,
        "a queued run is held by nobody"
    );
    assert_eq!(get(store, "requeue-queued").await, waiting);

    create(store, running("requeue-settled", OWNER, T0 + LEASE)).await;
    let answer = store
        .run_settle(settle(
            "requeue-settled",
            OWNER,
            crate::epoch_of(store, "requeue-settled").await,
        ))
        .await
        .unwrap();
    assert_eq!(answer, SettleAnswer::Settled);
    let done = get(store, "requeue-settled").await;
    assert_eq!(
        requeued(store, requeue("requeue-settled", OWNER, true, BUDGET)).await,
        RequeueAnswer::LeaseLost,
        "a terminal run never goes back"
    );
    assert_eq!(get(store, "requeue-settled").await, done);
    assert_eq!(
        requeued(store, requeue("no-such-run", OWNER, true, BUDGET)).await,
        RequeueAnswer::LeaseLost
    );
    assert_eq!(store.run_get("no-such-run").await.unwrap(), None);
    retire(store, &["requeue-lost", "requeue-queued"]).await;
}

async fn the_reaper_requeues_a_stale_run_and_dead_letters_a_fenced_one(store: &dyn QueueStore) {
    create(store, running("stale-plain", OWNER, T0 + 100)).await;
    create(store, running("stale-fenced", OWNER, T0)).await;
    fence(
        store,
        "stale-fenced",
        OWNER,
        Effect::NonIdempotentWrite,
        T0 + 200,
    )
    .await;
    create(store, running("stale-idempotent", OWNER, T0)).await;
    fence(
        store,
        "stale-idempotent",
        OWNER,
        Effect::IdempotentWrite,
        T0 + 300,
    )
    .await;
    let no_request = RunCreate {
        request: None,
        ..running("stale-no-request", OTHER, T0 + 400)
    };
    create(store, no_request).await;
    // A lease that ends exactly at the reaper's now is not yet expired.
    create(store, running("stale-not-yet", OWNER, T0 + 1_000)).await;

    let now = T0 + 1_000;
    let got = rescued(store, rescue(now, 1_000)).await;
    let requeued_once = RequeueAnswer::Requeued { requeue_count: 1 };
    assert_eq!(
        got,
        [
            Rescued {
                id: "stale-plain".into(),
                action: requeued_once
            },
            Rescued {
                id: "stale-fenced".into(),
                action: RequeueAnswer::DeadLettered(DeadLetter::FencedWrite)
            },
            Rescued {
                id: "stale-idempotent".into(),
                action: requeued_once
            },
            Rescued {
                id: "stale-no-request".into(),
                action: RequeueAnswer::DeadLettered(DeadLetter::NotRetryable)
            },
        ],
        "R9: every stale run, oldest lease first"
    );

    let plain = get(store, "stale-plain").await;
    assert_eq!(
        plain.status,
        RunState::Queued,
        "R9: a stale run is requeued"
    );
    assert_eq!(plain.claimed_by, None);
    assert_eq!(plain.lease_expires_ms, None);
    assert_eq!(
        plain.requeue_count, 1,
        "R9: a stale reclaim spends the budget"
    );
    assert_eq!(
        plain.termination_reason.as_deref(),
        Some("the lease of worker-a expired")
    );
    assert_eq!(plain.updated_ms, now);

    let fenced = get(store, "stale-fenced").await;
    assert_eq!(fenced.status, RunState::Failed);
    let reason = fenced.termination_reason.unwrap_or_default();
    assert!(reason.starts_with("FENCED_WRITE: "), "{reason}");
    assert!(
        reason.contains("non_idempotent_write"),
        "R9: the reason names the fenced write: {reason}"
    );
    assert!(
        reason.contains(OWNER),
        "and the segment that lost it: {reason}"
    );
    assert_eq!(
        fenced.pending_effect.as_deref(),
        Some("non_idempotent_write")
    );
    assert_eq!(fenced.requeue_count, 0);

    let no_request = get(store, "stale-no-request").await;
    assert_eq!(no_request.status, RunState::Failed);
    let reason = no_request.termination_reason.unwrap_or_default();
    assert!(reason.starts_with("NOT_RETRYABLE: "), "{reason}");
    assert!(reason.contains(OTHER), "{reason}");

    assert_eq!(get(store, "stale-not-yet").await.status, RunState::Running);

    // The first backoff is the base: due at now + 100.
    assert_eq!(
        claim(store, OWNER, now + 99).await,
        None,
        "R9: the backoff is waited out"
    );
    let next = claim(store, OWNER, now + 100)
        .await
        .expect("a requeued run is claimable");
    assert!(
        ["stale-plain", "stale-idempotent"].contains(&next.id.as_str()),
        "{}",
        next.id
    );
    retire(store, &["stale-plain", "stale-idempotent", "stale-not-yet"]).await;
}

async fn the_reaper_backs_off_exponentially_and_spends_the_shared_budget(store: &dyn QueueStore) {
    create(store, queued("backoff-1")).await;
    // One failed attempt already: the reaper shares the budget with retries (R9).
    claim_expecting(store, "backoff-1", T0).await;
    assert_eq!(
        requeued(store, requeue("backoff-1", OWNER, true, 3)).await,
        RequeueAnswer::Requeued { requeue_count: 1 }
    );
    let mut now = T0 + 10_000;
    for (count, delay) in [(2, 200), (3, 400)] {
        // Claimed with a lease that has run out by the reaper's next pass.
        let run = store
            .run_claim(Claim {
                owner: OWNER.into(),
                lease_until_ms: now + 1,
                now_ms: now,
                agents: None,
            })
            .await
            .unwrap()
            .expect("the run is due");
        assert_eq!(run.id, "backoff-1");
        now += 10;
        assert_eq!(
            rescued(store, rescue(now, 3)).await,
            [Rescued {
                id: "backoff-1".into(),
                action: RequeueAnswer::Requeued {
                    requeue_count: count
                }
            }]
        );
        assert_eq!(
            claim(store, OWNER, now + delay - 1).await,
            None,
            "R9: after {} requeues the delay is base * 2^{}",
            count - 1,
            count - 1
        );
        now += delay;
    }
    claim_expecting(store, "backoff-1", now).await;
    store
        .run_heartbeat(Heartbeat {
            id: "backoff-1".into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &"backoff-1").await,
            lease_until_ms: now + 1,
            now_ms: now,
        })
        .await
        .unwrap();
    assert_eq!(
        rescued(store, rescue(now + 10, 3)).await,
        [Rescued {
            id: "backoff-1".into(),
            action: RequeueAnswer::DeadLettered(DeadLetter::RetriesExhausted)
        }],
        "R9: at most 3 requeues, then dead-letter"
    );
    let dead = get(store, "backoff-1").await;
    assert_eq!(dead.status, RunState::Failed);
    assert_eq!(dead.requeue_count, 3);
    let reason = dead.termination_reason.unwrap_or_default();
    assert!(reason.starts_with("RETRIES_EXHAUSTED: "), "{reason}");
}

async fn the_reaper_takes_at_most_limit_runs_oldest_lease_first(store: &dyn QueueStore) {
    create(store, running("limit-3", OWNER, T0 + 300)).await;
    create(store, running("limit-1", OWNER, T0 + 100)).await;
    create(store, running("limit-2", OWNER, T0 + 200)).await;
    let once = Rescue {
        limit: 2,
        ..rescue(T0 + 1_000, BUDGET)
    };
    let ids = |got: Vec<Rescued>| got.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(rescued(store, once.clone()).await),
        ["limit-1", "limit-2"]
    );
    assert_eq!(ids(rescued(store, once.clone()).await), ["limit-3"]);
    assert!(rescued(store, once).await.is_empty());
    retire(store, &["limit-1", "limit-2", "limit-3"]).await;
}

async fn the_reaper_leaves_fresh_leases_alone(store: &dyn QueueStore) {
    let fresh = create(store, running("fresh-1", OWNER, T0 + LEASE)).await;
    let waiting = create(store, queued("fresh-queued")).await;
    assert!(
        rescued(store, rescue(T0 + LEASE, BUDGET)).await.is_empty(),
        "R9: only an expired lease is stale"
    );
    assert_eq!(get(store, "fresh-1").await, fresh);
    assert_eq!(
        get(store, "fresh-queued").await,
        waiting,
        "a queued run has no lease"
    );
    retire(store, &["fresh-1", "fresh-queued"]).await;
}

async fn a_heartbeat_that_lands_first_wins_over_the_reaper(store: &dyn QueueStore) {
    create(store, running("beat-first", OWNER, T0 + 100)).await;
    let renewed = store
        .run_heartbeat(Heartbeat {
            id: "beat-first".into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &"beat-first").await,
            lease_until_ms: T0 + 1_000 + LEASE,
            now_ms: T0 + 900,
        })
        .await
        .unwrap();
    assert!(
        renewed,
        "R3: the owner renews a lease that ran out if nobody took the run"
    );
    let held = get(store, "beat-first").await;
    assert!(
        rescued(store, rescue(T0 + 1_000, BUDGET)).await.is_empty(),
        "R9: a renewed lease is not stale"
    );
    assert_eq!(get(store, "beat-first").await, held);
    retire(store, &["beat-first"]).await;
}

async fn the_reaper_never_touches_a_cancelled_run(store: &dyn QueueStore) {
    create(store, running("reap-cancelled", OWNER, T0 + 100)).await;
    create(store, running("reap-cancelled-fenced", OWNER, T0)).await;
    fence(
        store,
        "reap-cancelled-fenced",
        OWNER,
        Effect::NonIdempotentWrite,
        T0 + 100,
    )
    .await;
    for id in ["reap-cancelled", "reap-cancelled-fenced"] {
        store.run_cancel(id, T0 + 50).await.unwrap();
    }
    let before = [
        get(store, "reap-cancelled").await,
        get(store, "reap-cancelled-fenced").await,
    ];
    assert!(
        rescued(store, rescue(T0 + 1_000, BUDGET)).await.is_empty(),
        "R4: no reaper path takes a cancelled run"
    );
    let after = [
        get(store, "reap-cancelled").await,
        get(store, "reap-cancelled-fenced").await,
    ];
    assert_eq!(
        after, before,
        "a cancelled mid-write run stays cancelled, not failed"
    );
}

async fn the_old_owner_cannot_append_after_the_reaper_took_the_run(store: &dyn QueueStore) {
    create(store, running("taken-1", OWNER, T0 + 100)).await;
    assert_eq!(rescued(store, rescue(T0 + 1_000, BUDGET)).await.len(), 1);
    let check_refused = |when: &'static str| async move {
        assert_eq!(
            store
                .run_event_append(event(
                    "taken-1",
                    OWNER,
                    crate::epoch_of(store, "taken-1").await
                ))
                .await
                .unwrap(),
            None,
            "R3: the old owner appends nothing {when}"
        );
        assert_eq!(
            store
                .run_settle(settle(
                    "taken-1",
                    OWNER,
                    crate::epoch_of(store, "taken-1").await
                ))
                .await
                .unwrap(),
            SettleAnswer::LeaseLost,
            "R3: the old owner settles nothing {when}"
        );
        let beat = Heartbeat {
            id: "taken-1".into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &"taken-1").await,
            lease_until_ms: T0 + 90_000,
            now_ms: T0 + 50_000,
        };
        assert!(
            !store.run_heartbeat(beat).await.unwrap(),
            "R3: the old owner's renewal matches no row {when}"
        );
        assert_eq!(
            requeued(store, requeue("taken-1", OWNER, true, BUDGET)).await,
            RequeueAnswer::LeaseLost
        );
    };
    check_refused("while the run is queued").await;
    let queued_run = get(store, "taken-1").await;
    assert_eq!(queued_run.status, RunState::Queued);
    assert!(store.run_events("taken-1", 0, 0).await.unwrap().is_empty());

    let run = store
        .run_claim(Claim {
            owner: OTHER.into(),
            lease_until_ms: T0 + 9_000 + LEASE,
            now_ms: T0 + 9_000,
            agents: None,
        })
        .await
        .unwrap()
        .expect("the requeued run is due");
    assert_eq!(run.id, "taken-1");
    assert_eq!(run.claimed_by.as_deref(), Some(OTHER));
    check_refused("after another worker claimed it").await;
    assert_eq!(
        store
            .run_event_append(event(
                "taken-1",
                OTHER,
                crate::epoch_of(store, "taken-1").await
            ))
            .await
            .unwrap(),
        Some(1),
        "the new owner appends"
    );
    assert_eq!(
        store
            .run_settle(settle(
                "taken-1",
                OTHER,
                crate::epoch_of(store, "taken-1").await
            ))
            .await
            .unwrap(),
        SettleAnswer::Settled
    );
}

async fn a_requeue_decided_on_a_row_that_changed_since_changes_nothing(store: &dyn QueueStore) {
    // The requeue count moved: the reaper took the run and the same owner claimed it again.
    create(store, running("stale-read-count", OWNER, T0 + 100)).await;
    let read = get(store, "stale-read-count").await;
    let policy = RetryPolicy::default();
    let decision = policy.decide(&read, RequeueCause::Failure, T0 + 10, 0.5);
    assert!(matches!(decision, RetryDecision::Requeue { .. }));
    assert_eq!(rescued(store, rescue(T0 + 1_000, BUDGET)).await.len(), 1);
    claim_expecting(store, "stale-read-count", T0 + 9_000).await;
    let held = get(store, "stale-read-count").await;
    assert_eq!(held.requeue_count, 1);
    let late = RequeueApply {
        id: read.id.clone(),
        owner: OWNER.into(),
        epoch: read.claim_epoch,
        requeue_count: read.requeue_count,
        pending_effect: read.pending_effect.clone(),
        decision,
        reason: "the model answered 503".into(),
        counts: true,
        now_ms: T0 + 9_010,
    };
    assert_eq!(
        store.run_requeue_apply(late).await.unwrap(),
        RequeueAnswer::LeaseLost,
        "R9: the guard re-checks the requeue count the decision read"
    );
    assert_eq!(get(store, "stale-read-count").await, held);

    // The pending effect moved: a non-idempotent write was fenced after the read, so a
    // requeue decided before it must not put the run back.
    create(store, running("stale-read-fence", OWNER, T0 + LEASE)).await;
    let read = get(store, "stale-read-fence").await;
    let decision = policy.decide(&read, RequeueCause::Failure, T0 + 10, 0.5);
    fence(
        store,
        "stale-read-fence",
        OWNER,
        Effect::NonIdempotentWrite,
        T0 + LEASE,
    )
    .await;
    let fenced = get(store, "stale-read-fence").await;
    let late = RequeueApply {
        id: read.id.clone(),
        owner: OWNER.into(),
        epoch: read.claim_epoch,
        requeue_count: read.requeue_count,
        pending_effect: read.pending_effect.clone(),
        decision,
        reason: "the model answered 503".into(),
        counts: true,
        now_ms: T0 + 20,
    };
    assert_eq!(
        store.run_requeue_apply(late).await.unwrap(),
        RequeueAnswer::LeaseLost,
        "R9: a fenced write is never requeued on a decision that did not see the fence"
    );
    assert_eq!(get(store, "stale-read-fence").await, fenced);
    retire(store, &["stale-read-count", "stale-read-fence"]).await;
}

async fn a_rescue_decided_on_a_row_that_changed_since_is_skipped(store: &dyn QueueStore) {
    let policy = RetryPolicy::default();
    let late = |run: &Run, now_ms: i64| RescueApply {
        id: run.id.clone(),
        owner: run.claimed_by.clone(),
        requeue_count: run.requeue_count,
        pending_effect: run.pending_effect.clone(),
        decision: policy.decide(run, RequeueCause::LeaseExpired, now_ms, 0.5),
        reason: "the lease expired".into(),
        now_ms,
    };
    // Settled after the reaper read it.
    create(store, running("rescue-settled", OWNER, T0 + 100)).await;
    let stale = store.run_stale(T0 + 1_000, 100).await.unwrap();
    assert_eq!(
        stale.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["rescue-settled"],
        "R9: the one expired lease"
    );
    assert_eq!(
        stale[0],
        get(store, "rescue-settled").await,
        "the whole row"
    );
    let renewed = store
        .run_heartbeat(Heartbeat {
            id: "rescue-settled".into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &"rescue-settled").await,
            lease_until_ms: T0 + 900 + LEASE,
            now_ms: T0 + 900,
        })
        .await
        .unwrap();
    assert!(renewed);
    assert_eq!(
        store
            .run_settle(settle(
                "rescue-settled",
                OWNER,
                crate::epoch_of(store, "rescue-settled").await
            ))
            .await
            .unwrap(),
        SettleAnswer::Settled
    );
    let done = get(store, "rescue-settled").await;
    assert!(
        !store
            .run_rescue_apply(late(&stale[0], T0 + 1_000))
            .await
            .unwrap(),
        "R9: a settled run is not rescued"
    );
    assert_eq!(get(store, "rescue-settled").await, done);

    // Fenced by its (slow) owner after the read: the lease was renewed and the mark moved.
    create(store, running("rescue-fenced-late", OWNER, T0 + 100)).await;
    let stale = store.run_stale(T0 + 1_000, 100).await.unwrap();
    assert_eq!(stale.len(), 1);
    fence(
        store,
        "rescue-fenced-late",
        OWNER,
        Effect::NonIdempotentWrite,
        T0 + 1_000,
    )
    .await;
    let expired_again = T0 + 2_000;
    let fenced = get(store, "rescue-fenced-late").await;
    assert!(
        !store
            .run_rescue_apply(late(&stale[0], expired_again))
            .await
            .unwrap(),
        "R9: a requeue decided before the fence never lands after it"
    );
    assert_eq!(get(store, "rescue-fenced-late").await, fenced);
    assert_eq!(
        rescued(store, rescue(expired_again, BUDGET)).await,
        [Rescued {
            id: "rescue-fenced-late".into(),
            action: RequeueAnswer::DeadLettered(DeadLetter::FencedWrite)
        }],
        "a fresh read sees the fence and dead-letters"
    );
}

async fn two_reapers_deciding_on_one_stale_run_apply_exactly_once(store: &Arc<dyn QueueStore>) {
    const REAPERS: usize = 8;
    create(&**store, running("reaped-once", OWNER, T0 + 100)).await;
    let read = store.run_stale(T0 + 1_000, 100).await.unwrap();
    assert_eq!(read.len(), 1);
    let mut tasks = Vec::new();
    for n in 0..REAPERS {
        let (store, run) = (Arc::clone(store), read[0].clone());
        tasks.push(tokio::spawn(async move {
            let policy = RetryPolicy::default();
            let apply = RescueApply {
                id: run.id.clone(),
                owner: run.claimed_by.clone(),
                requeue_count: run.requeue_count,
                pending_effect: run.pending_effect.clone(),
                decision: policy.decide(&run, RequeueCause::LeaseExpired, T0 + 1_000, 0.5),
                reason: format!("reaper {n}: the lease expired"),
                now_ms: T0 + 1_000,
            };
            store
                .run_rescue_apply(apply)
                .await
                .expect("run_rescue_apply")
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += usize::from(task.await.expect("a reaper panicked"));
    }
    assert_eq!(applied, 1, "R9: one stale run is rescued exactly once");
    let back = get(&**store, "reaped-once").await;
    assert_eq!(back.status, RunState::Queued);
    assert_eq!(back.requeue_count, 1, "the budget is spent once");
    retire(&**store, &["reaped-once"]).await;
}

/// How long a published change may take to arrive (PostgreSQL's NOTIFY crosses a
/// connection; SQLite publishes in-process).
const FEED_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (bounded, never sleeping) until `expected` arrives on the feed, skipping other
/// changes; a receiver that lagged or a timeout fails the check.
async fn heard(feed: &mut broadcast::Receiver<Change>, expected: Change) {
    let wait = async {
        loop {
            match feed.recv().await {
                Ok(change) if change == expected => return,
                Ok(_) => continue,
                Err(error) => panic!("the feed failed while waiting for {expected:?}: {error}"),
            }
        }
    };
    tokio::time::timeout(FEED_WAIT, wait)
        .await
        .unwrap_or_else(|_| panic!("{expected:?} was not published within {FEED_WAIT:?}"));
}

/// O6: every committed run change reaches the store's feed: a new queued run (its status,
/// and that a worker may claim), a claim, an appended event with its sequence number, a
/// cancel.
async fn committed_writes_are_published_on_the_feed(store: &dyn QueueStore) {
    let id = "feed-1";
    let status = |status| Change::Status {
        run_id: id.into(),
        status,
    };
    let mut feed = store.change_feed().subscribe();
    create(store, queued(id)).await;
    heard(&mut feed, status(RunState::Queued)).await;
    heard(&mut feed, Change::Ready).await;

    claim_expecting(store, id, T0).await;
    heard(&mut feed, status(RunState::Running)).await;

    let seq = store
        .run_event_append(EventAppend {
            id: id.into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &id).await,
            kind: "model_response".into(),
            payload: json!({"text": "on it"}),
            clear_fence: false,
            round: Some(1),
            end: None,
            now_ms: T0 + 1,
        })
        .await
        .expect("run_event_append")
        .expect("the owner may append");
    heard(
        &mut feed,
        Change::Appended {
            run_id: id.into(),
            seq,
        },
    )
    .await;

    let answer = store.run_cancel(id, T0 + 2).await.expect("run_cancel");
    assert!(matches!(answer, CancelAnswer::Cancelled { .. }));
    heard(&mut feed, status(RunState::Cancelled)).await;
}
