//! The lease and the write fence: only the owner renews, only a running run is fenced.

use super::*;

pub(super) async fn a_heartbeat_by_another_owner_is_refused(store: &dyn RunStore) {
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

pub(super) async fn a_fence_mark_needs_the_lease_and_a_running_run(store: &dyn RunStore) {
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
