//! A segment's requeue and dead letter: the backoff, the budget, the write fence, and what a cancel or a lost lease makes of them.

use super::*;

pub(super) async fn requeue_puts_the_run_back_with_its_backoff_and_counts_the_attempt(
    store: &dyn QueueStore,
) {
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

pub(super) async fn a_graceful_requeue_does_not_spend_the_budget(store: &dyn QueueStore) {
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

pub(super) async fn requeue_beyond_the_budget_dead_letters_retries_exhausted(
    store: &dyn QueueStore,
) {
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

pub(super) async fn a_fenced_non_idempotent_write_is_dead_lettered_never_requeued(
    store: &dyn QueueStore,
) {
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

pub(super) async fn a_fenced_idempotent_write_may_be_requeued(store: &dyn QueueStore) {
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

pub(super) async fn a_run_without_a_stored_request_is_dead_lettered_not_retryable(
    store: &dyn QueueStore,
) {
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

pub(super) async fn requeue_after_a_cancel_answers_already_cancelled(store: &dyn QueueStore) {
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

pub(super) async fn requeue_by_a_lost_owner_changes_nothing(store: &dyn QueueStore) {
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
