//! Reads: the status, the list and its pages, the counts, many statuses in one call.

use super::*;

pub(super) async fn status_now_reads_the_current_status(store: &dyn RunStore) {
    assert_eq!(status_now(store, "status-1").await, None);
    create(store, queued("status-1")).await;
    assert_eq!(status_now(store, "status-1").await, Some(RunState::Queued));
    cancel(store, "status-1", T0 + 1).await;
    assert_eq!(
        status_now(store, "status-1").await,
        Some(RunState::Cancelled),
        "R6: the probe sees a cancel as soon as it is committed"
    );

    create(store, running("status-2")).await;
    assert_eq!(status_now(store, "status-2").await, Some(RunState::Running));
    settled(store, settle("status-2", OWNER, RunState::Failed)).await;
    assert_eq!(status_now(store, "status-2").await, Some(RunState::Failed));
}

pub(super) async fn the_list_is_newest_first_filtered_and_paged_by_cursor(store: &dyn RunStore) {
    // UUIDv7-shaped ids in creation order, under an agent no other check uses.
    let ids: Vec<String> = (1..=5)
        .map(|n| format!("01900000-0000-7000-8000-0000000list{n}"))
        .collect();
    for (n, id) in ids.iter().enumerate() {
        let mut params = if n % 2 == 0 { queued(id) } else { running(id) };
        params.agent = "lister".into();
        create(store, params).await;
    }
    let list = |filter: RunFilter| async move {
        store
            .run_list(filter)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    let all = list(RunFilter {
        agent: Some("lister".into()),
        ..RunFilter::default()
    })
    .await;
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(all, newest_first);
    let first_page = list(RunFilter {
        agent: Some("lister".into()),
        limit: 2,
        ..RunFilter::default()
    })
    .await;
    assert_eq!(first_page, newest_first[..2]);
    let second_page = list(RunFilter {
        agent: Some("lister".into()),
        limit: 2,
        before_id: first_page.last().cloned(),
        ..RunFilter::default()
    })
    .await;
    assert_eq!(
        second_page,
        newest_first[2..4],
        "the cursor continues without gaps or repeats"
    );
    let queued_only = list(RunFilter {
        agent: Some("lister".into()),
        status: Some(RunState::Queued),
        ..RunFilter::default()
    })
    .await;
    assert_eq!(
        queued_only,
        [ids[4].clone(), ids[2].clone(), ids[0].clone()]
    );
}

pub(super) async fn counts_follow_every_transition(store: &dyn RunStore) {
    let count = |counts: &[(RunState, u64)], state: RunState| {
        counts
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    };
    let before = store.run_counts().await.unwrap();
    let moved = |now: &[(RunState, u64)], changes: &[(RunState, i64)]| {
        for state in RunState::ALL {
            let change = changes
                .iter()
                .find(|(s, _)| *s == state)
                .map_or(0, |(_, n)| *n);
            assert_eq!(
                count(now, state) as i64,
                count(&before, state) as i64 + change,
                "runs {}: {now:?} after {changes:?}, from {before:?}",
                state.as_str()
            );
        }
    };
    let id = "01900000-0000-7000-8000-00000000cnt1";
    create(store, queued(id)).await;
    moved(&store.run_counts().await.unwrap(), &[(RunState::Queued, 1)]);
    cancel(store, id, T0).await;
    moved(
        &store.run_counts().await.unwrap(),
        &[(RunState::Cancelled, 1)],
    );
    // Every other way a run ends: settled completed, settled failed, cancelled running.
    let (done, failed, stopped) = ("counts-done", "counts-failed", "counts-stopped");
    for id in [done, failed, stopped] {
        create(store, running(id)).await;
    }
    moved(
        &store.run_counts().await.unwrap(),
        &[(RunState::Cancelled, 1), (RunState::Running, 3)],
    );
    settled(store, settle(done, OWNER, RunState::Completed)).await;
    settled(store, settle(failed, OWNER, RunState::Failed)).await;
    cancel(store, stopped, T0).await;
    // A settle refused (the run already ended) changes no count.
    settled(store, settle(done, OWNER, RunState::Failed)).await;
    moved(
        &store.run_counts().await.unwrap(),
        &[
            (RunState::Cancelled, 2),
            (RunState::Completed, 1),
            (RunState::Failed, 1),
        ],
    );
}

/// R6 (amended): the status watcher's batched read answers every known run of the list in
/// one call and leaves out ids with no run.
pub(super) async fn run_statuses_answers_many_runs_in_one_call(store: &dyn RunStore) {
    create(store, running("statuses-running")).await;
    create(store, queued("statuses-queued")).await;
    create(store, running("statuses-cancelled")).await;
    cancel(store, "statuses-cancelled", T0 + 1).await;
    let ids: Vec<String> = [
        "statuses-running",
        "statuses-queued",
        "statuses-cancelled",
        "statuses-unknown",
    ]
    .map(String::from)
    .to_vec();
    let mut statuses = store.run_statuses(&ids).await.expect("run_statuses");
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        statuses,
        vec![
            ("statuses-cancelled".to_owned(), RunState::Cancelled),
            ("statuses-queued".to_owned(), RunState::Queued),
            ("statuses-running".to_owned(), RunState::Running),
        ],
        "one answer per known run, none for an unknown id"
    );
    assert!(
        store
            .run_statuses(&[])
            .await
            .expect("run_statuses of nothing")
            .is_empty()
    );
    // One id, as a step asks about its own run.
    for (id, want) in [
        ("statuses-cancelled", Some(RunState::Cancelled)),
        ("statuses-unknown", None),
    ] {
        let one = store
            .run_statuses(&[id.to_owned()])
            .await
            .expect("run_statuses of one run");
        assert_eq!(
            one,
            want.map(|s| (id.to_owned(), s))
                .into_iter()
                .collect::<Vec<_>>()
        );
    }
}
