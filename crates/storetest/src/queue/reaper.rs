//! The reaper's rescue of stale runs: backoff, limits, its races with a heartbeat, a cancel, a changed row and another reaper.

use super::*;

pub(super) async fn the_reaper_requeues_a_stale_run_and_dead_letters_a_fenced_one(
    store: &dyn QueueStore,
) {
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

    rows_the_reaper_left(store, now).await;

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

/// The rows of the reaper's first pass: requeued with the budget spent, dead-lettered
/// with the fenced write and the lost segment named, and a lease not yet run out left.
async fn rows_the_reaper_left(store: &dyn QueueStore, now: i64) {
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
}

pub(super) async fn the_reaper_backs_off_exponentially_and_spends_the_shared_budget(
    store: &dyn QueueStore,
) {
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
                start: false,
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

pub(super) async fn the_reaper_takes_at_most_limit_runs_oldest_lease_first(store: &dyn QueueStore) {
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

pub(super) async fn the_reaper_leaves_fresh_leases_alone(store: &dyn QueueStore) {
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

pub(super) async fn a_heartbeat_that_lands_first_wins_over_the_reaper(store: &dyn QueueStore) {
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

pub(super) async fn the_reaper_never_touches_a_cancelled_run(store: &dyn QueueStore) {
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

pub(super) async fn the_old_owner_cannot_append_after_the_reaper_took_the_run(
    store: &dyn QueueStore,
) {
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
            start: false,
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

pub(super) async fn a_requeue_decided_on_a_row_that_changed_since_changes_nothing(
    store: &dyn QueueStore,
) {
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

pub(super) async fn a_rescue_decided_on_a_row_that_changed_since_is_skipped(
    store: &dyn QueueStore,
) {
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

pub(super) async fn two_reapers_deciding_on_one_stale_run_apply_exactly_once(
    store: &Arc<dyn QueueStore>,
) {
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
