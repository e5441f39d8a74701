//! The settle: completed or failed only, refused after a cancel and to a lost owner.

use super::*;

pub(super) async fn settle_moves_a_running_run_to_completed_or_failed(store: &dyn RunStore) {
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

pub(super) async fn settle_accepts_only_completed_or_failed(store: &dyn RunStore) {
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

pub(super) async fn settle_is_refused_after_a_cancel_and_the_run_stays_cancelled(
    store: &dyn RunStore,
) {
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

pub(super) async fn settle_by_a_lost_owner_changes_nothing(store: &dyn RunStore) {
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
