//! The cancel: any non-terminal run, never a terminal one, the stored request dropped and the pending effect kept.

use super::*;

pub(super) async fn cancel_moves_any_non_terminal_run_and_drops_the_request(store: &dyn RunStore) {
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
        assert_eq!(
            after.termination_reason.as_deref(),
            Some(runwarden_runtime::rules::runs::CANCEL_REASON),
            "a cancelled run says why it ended, in the same words on every backend"
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

pub(super) async fn cancelling_a_terminal_run_is_refused_with_its_state(store: &dyn RunStore) {
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

pub(super) async fn cancelling_an_unknown_run_says_not_found(store: &dyn RunStore) {
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

pub(super) async fn cancel_keeps_the_pending_effect(store: &dyn RunStore) {
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
