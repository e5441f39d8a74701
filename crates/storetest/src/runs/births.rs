//! A new run: absent until created, claimed at birth or queued with its request, its id used once.

use super::*;

pub(super) async fn an_unknown_run_is_absent(store: &dyn RunStore) {
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

pub(super) async fn a_synchronous_run_is_claimed_at_birth(store: &dyn RunStore) {
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
        origin: Default::default(),
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

pub(super) async fn a_queued_run_has_no_owner_and_keeps_its_request(store: &dyn RunStore) {
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

pub(super) async fn a_run_keeps_who_started_it_and_its_tags(store: &dyn RunStore) {
    let origin = RunOrigin {
        started_by: Some("ci-bot".into()),
        tags: vec!["team:payments".into(), "env=prod".into()],
    };
    let created = create(
        store,
        RunCreate {
            origin: origin.clone(),
            ..queued("origin-1")
        },
    )
    .await;
    assert_eq!(created.origin, origin);
    assert_eq!(
        get(store, "origin-1").await.origin,
        origin,
        "who started a run and its tags are stored, in order"
    );
    let plain = create(store, queued("origin-2")).await;
    assert_eq!(
        get(store, "origin-2").await.origin,
        plain.origin,
        "a run started on the command line has no starter and no tags"
    );
    assert_eq!(plain.origin, RunOrigin::default());
}

pub(super) async fn a_run_id_is_used_once(store: &dyn RunStore) {
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
