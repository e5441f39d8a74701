//! Claims: the oldest due run first, exactly one winner, never a run not yet due or cancelled.

use super::*;

pub(super) async fn a_claim_takes_the_oldest_due_queued_run(store: &dyn QueueStore) {
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

pub(super) async fn a_run_is_claimed_exactly_once_by_concurrent_claimants(
    store: &Arc<dyn QueueStore>,
) {
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

pub(super) async fn a_run_not_yet_due_is_not_claimed(store: &dyn QueueStore) {
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

pub(super) async fn a_cancelled_queued_run_is_never_claimed(store: &dyn QueueStore) {
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

/// A claim that reads the run's events with it answers the row the claim stored and, when
/// it read them, exactly the events stored before it: a requeued run resumes from them.
pub(super) async fn a_claim_with_its_history_answers_the_stored_events(store: &dyn QueueStore) {
    create(store, queued("history-1")).await;
    let first = claim_with_history(store, T0 + 100).await;
    assert_eq!(first.run.id, "history-1");
    if let Some(history) = &first.history {
        assert!(history.is_empty(), "a new run has no events: {history:?}");
    }
    let epoch = first.run.claim_epoch;
    for _ in 0..2 {
        let appended = store
            .run_event_append(event("history-1", OWNER, epoch))
            .await
            .unwrap();
        assert!(appended.is_some(), "the claimant appends");
    }
    let graceful = requeue("history-1", OWNER, false, BUDGET);
    assert_eq!(
        requeued(store, graceful).await,
        RequeueAnswer::Requeued { requeue_count: 0 }
    );
    let again = claim_with_history(store, T0 + 1_000).await;
    assert_eq!(
        again.run,
        get(store, "history-1").await,
        "the claim answers the stored row"
    );
    assert_eq!(
        again.run.claim_epoch,
        epoch + 1,
        "the claim raises the epoch"
    );
    if let Some(history) = &again.history {
        let stored = store.run_events("history-1", 0, 0).await.unwrap();
        assert_eq!(history, &stored, "the events read with the claim");
        assert_eq!(history.len(), 2);
    }
    let claim = Claim {
        owner: OWNER.into(),
        lease_until_ms: T0 + 1_000 + LEASE,
        now_ms: T0 + 1_000,
        agents: None,
        start: false,
    };
    assert_eq!(
        store.run_claim_many(claim, 1).await.unwrap(),
        Vec::new(),
        "nothing left to claim"
    );
    retire(store, &["history-1"]).await;
}

async fn claim_with_history(store: &dyn QueueStore, now_ms: i64) -> Claimed {
    let claim = Claim {
        owner: OWNER.into(),
        lease_until_ms: now_ms + LEASE,
        now_ms,
        agents: None,
        start: false,
    };
    store
        .run_claim_many(claim, 1)
        .await
        .expect("run_claim_many")
        .pop()
        .expect("a due run to claim")
}

/// A claim of several runs takes the oldest due ones in order, each as a claim of one
/// would (running, held, the stored row answered), never more than asked.
pub(super) async fn a_claim_of_several_takes_the_oldest_due_runs_in_order(store: &dyn QueueStore) {
    create(store, queued_at("many-b", T0 + 20)).await;
    create(store, queued_at("many-a", T0 + 10)).await;
    create(store, queued_at("many-c", T0 + 30)).await;
    let claim = |now_ms: i64| Claim {
        owner: OWNER.into(),
        lease_until_ms: now_ms + LEASE,
        now_ms,
        agents: None,
        start: false,
    };
    let first = store.run_claim_many(claim(T0 + 100), 2).await.unwrap();
    let ids: Vec<&str> = first.iter().map(|c| c.run.id.as_str()).collect();
    assert_eq!(
        ids,
        ["many-a", "many-b"],
        "the oldest due runs, no more than asked"
    );
    for claimed in &first {
        assert_eq!(claimed.run, get(store, &claimed.run.id).await);
        assert_eq!(claimed.run.status, RunState::Running);
        assert_eq!(claimed.run.claimed_by.as_deref(), Some(OWNER));
        assert_eq!(claimed.run.lease_expires_ms, Some(T0 + 100 + LEASE));
    }
    let rest = store.run_claim_many(claim(T0 + 200), 5).await.unwrap();
    let ids: Vec<&str> = rest.iter().map(|c| c.run.id.as_str()).collect();
    assert_eq!(ids, ["many-c"], "what is left, fewer than asked");
    assert!(
        store
            .run_claim_many(claim(T0 + 300), 5)
            .await
            .unwrap()
            .is_empty()
    );
    retire(store, &["many-a", "many-b", "many-c"]).await;
}

/// A claim that starts its runs records `run_started` for a claimed run with no events, in
/// the claim's transaction (`started` answers it); never for a run that has events, nor
/// for one without a stored prompt.
pub(super) async fn a_starting_claim_records_a_new_runs_start_once(store: &dyn QueueStore) {
    let with_prompt = RunCreate {
        request: Some(json!({"prompt": "file a ticket"})),
        ..queued_at("start-1", T0 + 1)
    };
    create(store, with_prompt).await;
    create(store, queued_at("start-no-prompt", T0 + 2)).await;
    let claim = |now_ms: i64| Claim {
        owner: OWNER.into(),
        lease_until_ms: now_ms + LEASE,
        now_ms,
        agents: None,
        start: true,
    };
    let claimed = store.run_claim_many(claim(T0 + 100), 2).await.unwrap();
    let [first, no_prompt] = &claimed[..] else {
        panic!("two runs claimed: {claimed:?}");
    };
    let stored = store.run_events("start-1", 0, 0).await.unwrap();
    let started = first.started.as_ref().expect("the claim records the start");
    assert_eq!(
        stored,
        std::slice::from_ref(started),
        "the start, stored with the claim"
    );
    assert_eq!((started.seq, started.kind.as_str()), (1, "run_started"));
    let expected = json!({"agent": "helpdesk", "prompt": "file a ticket", "owner": OWNER});
    assert_eq!(started.payload, expected);
    assert_eq!(
        first.history.as_deref(),
        Some(&[][..]),
        "not in the history"
    );
    assert_eq!(no_prompt.started, None, "no prompt, no start");
    assert!(
        store
            .run_events("start-no-prompt", 0, 0)
            .await
            .unwrap()
            .is_empty()
    );

    let epoch = first.run.claim_epoch;
    let appended = store.run_event_append(event("start-1", OWNER, epoch)).await;
    assert!(appended.unwrap().is_some());
    let graceful = requeue("start-1", OWNER, false, BUDGET);
    assert!(matches!(
        requeued(store, graceful).await,
        RequeueAnswer::Requeued { .. }
    ));
    let again = store.run_claim_many(claim(T0 + 1_000), 1).await.unwrap();
    assert_eq!(again[0].run.id, "start-1");
    assert_eq!(
        again[0].started, None,
        "a run with events is resumed, not started"
    );
    let kinds: Vec<String> = store
        .run_events("start-1", 0, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["run_started", "tool_executed"], "one start");
    retire(store, &["start-1", "start-no-prompt"]).await;
}
