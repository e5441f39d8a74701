//! The audit log: contiguous ids, links to the predecessor, the tip, filters, batches, intents and counts.

use super::*;

fn event(action: &str, correlation: Option<&str>, n: i64) -> AuditEvent {
    AuditEvent {
        time_ms: 1_700_000_000_000 + n,
        action: action.into(),
        success: n % 2 == 0,
        secret: Some("github_token".into()),
        method: "POST".into(),
        host: "api.example.com".into(),
        path: format!("/v1/items/{n}"),
        status: 200,
        duration_ms: 12,
        error: None,
        reason: Some("tool call".into()),
        actor: "run".into(),
        correlation: correlation.map(Into::into),
        intent_id: None,
    }
}

async fn append(store: &dyn VaultStore, chain: &Arc<AuditChain>, event: AuditEvent) -> AuditRow {
    store
        .audit_append(event, Arc::clone(chain))
        .await
        .expect("audit_append")
}

async fn all_rows(store: &dyn VaultStore) -> Vec<AuditRow> {
    store.audit_list(AuditFilter::default()).await.unwrap()
}

pub(super) async fn an_empty_log_has_no_rows_no_tip_and_verifies(
    store: &dyn VaultStore,
    chain: &AuditChain,
) {
    assert!(
        all_rows(store).await.is_empty(),
        "the suite needs an empty audit log"
    );
    assert_eq!(store.audit_tip().await.unwrap(), None);
    let report = chain.verify(store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, 0);
}

pub(super) async fn audit_ids_are_contiguous_from_one(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    for n in 1..=5 {
        let row = append(store, chain, event(action::HTTP_CALL, Some("run-a"), n)).await;
        assert_eq!(row.id, n, "V7: ids start at 1 and grow by one");
    }
    let ids: Vec<i64> = all_rows(store).await.iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
}

pub(super) async fn audit_rows_link_to_their_predecessor(
    store: &dyn VaultStore,
    chain: &AuditChain,
) {
    let mut prev_hash = [0u8; 32];
    for row in all_rows(store).await {
        assert_eq!(
            row.prev_hash, prev_hash,
            "row {} links to the hash of the row before",
            row.id
        );
        assert_eq!(row.hash, chain.link(row.id, &row.event, &row.prev_hash));
        prev_hash = row.hash;
    }
}

pub(super) async fn audit_tip_tracks_the_newest_row(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    let row = append(store, chain, event(action::HTTP_CALL_REFUSED, None, 6)).await;
    let tip = store
        .audit_tip()
        .await
        .unwrap()
        .expect("a tip after an append");
    assert_eq!((tip.last_id, tip.last_hash), (row.id, row.hash));
    assert_eq!(tip.anchor, chain.anchor(row.id, &row.hash));
}

pub(super) async fn audit_rows_return_every_field(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
    let full = AuditEvent {
        time_ms: -1,
        action: action::HTTP_CALL_CANCELLED.into(),
        success: true,
        secret: Some("ünïcode secret name".into()),
        method: "DELETE".into(),
        host: "[2001:db8::1]".into(),
        path: "/a path/with spaces".into(),
        status: u16::MAX,
        duration_ms: i64::MAX as u64,
        error: Some("connection reset by peer".into()),
        reason: Some("operator cancel".into()),
        actor: "token:ops".into(),
        correlation: Some("run-b".into()),
        intent_id: Some(i64::MAX),
    };
    let empty = AuditEvent {
        success: false,
        secret: None,
        status: 0,
        duration_ms: 0,
        error: None,
        reason: None,
        correlation: None,
        intent_id: None,
        ..event(action::HTTP_CALL_CANCELLED_BEFORE_SEND, None, 8)
    };
    for original in [full, empty] {
        let appended = append(store, chain, original.clone()).await;
        assert_eq!(appended.event, original);
        let filter = AuditFilter {
            after_id: Some(appended.id - 1),
            limit: 1,
            ..AuditFilter::default()
        };
        assert_eq!(store.audit_list(filter).await.unwrap(), [appended]);
    }
}

pub(super) async fn audit_filter_by_action_and_correlation(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    append(
        store,
        chain,
        event(action::HTTP_CALL_REFUSED, Some("run-a"), 9),
    )
    .await;
    let all = all_rows(store).await;
    let by = |keep: &dyn Fn(&AuditRow) -> bool| {
        all.iter().filter(|r| keep(r)).cloned().collect::<Vec<_>>()
    };
    let cases = [
        (
            Some(action::HTTP_CALL_REFUSED),
            None,
            by(&|r| r.event.action == action::HTTP_CALL_REFUSED),
        ),
        (
            None,
            Some("run-a"),
            by(&|r| r.event.correlation.as_deref() == Some("run-a")),
        ),
        (
            Some(action::HTTP_CALL_REFUSED),
            Some("run-a"),
            by(&|r| {
                r.event.action == action::HTTP_CALL_REFUSED
                    && r.event.correlation.as_deref() == Some("run-a")
            }),
        ),
        (Some("no_such_action"), None, Vec::new()),
    ];
    for (action, correlation, expected) in cases {
        let filter = AuditFilter {
            action: action.map(Into::into),
            correlation: correlation.map(Into::into),
            ..AuditFilter::default()
        };
        assert_eq!(
            store.audit_list(filter.clone()).await.unwrap(),
            expected,
            "{filter:?}"
        );
    }
    assert_eq!(
        by(&|r| r.event.action == action::HTTP_CALL_REFUSED).len(),
        2,
        "the cases above are not vacuous"
    );
}

pub(super) async fn audit_filter_after_id_newest_first_and_limit(store: &dyn VaultStore) {
    let all = all_rows(store).await;
    let ids = |rows: Vec<AuditRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let list = |filter: AuditFilter| async move { ids(store.audit_list(filter).await.unwrap()) };
    let last = all.last().unwrap().id;
    assert_eq!(
        list(AuditFilter {
            after_id: Some(3),
            ..Default::default()
        })
        .await,
        (4..=last).collect::<Vec<_>>()
    );
    assert_eq!(
        list(AuditFilter {
            after_id: Some(last),
            ..Default::default()
        })
        .await,
        Vec::<i64>::new()
    );
    assert_eq!(
        list(AuditFilter {
            limit: 2,
            ..Default::default()
        })
        .await,
        [1, 2]
    );
    assert_eq!(
        list(AuditFilter {
            newest_first: true,
            limit: 2,
            ..Default::default()
        })
        .await,
        [last, last - 1]
    );
    assert_eq!(
        list(AuditFilter {
            limit: 0,
            ..Default::default()
        })
        .await
        .len(),
        all.len(),
        "limit 0 means no limit"
    );
    let filter = AuditFilter {
        action: Some(action::HTTP_CALL.into()),
        correlation: Some("run-a".into()),
        after_id: Some(1),
        newest_first: true,
        limit: 3,
    };
    assert_eq!(
        list(filter).await,
        [5, 4, 3],
        "all filter fields apply together"
    );
}

pub(super) async fn concurrent_appends_get_contiguous_ids(
    store: &Arc<dyn VaultStore>,
    chain: &Arc<AuditChain>,
) {
    let start = store
        .audit_tip()
        .await
        .unwrap()
        .map_or(0, |tip| tip.last_id);
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (store, chain) = (Arc::clone(store), Arc::clone(chain));
            tokio::spawn(async move {
                for n in 0..10 {
                    store
                        .audit_append(
                            event(action::HTTP_CALL, Some("run-c"), task * 100 + n),
                            Arc::clone(&chain),
                        )
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("append task");
    }
    let ids: Vec<i64> = all_rows(&**store).await.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        (1..=start + 80).collect::<Vec<_>>(),
        "V7: concurrent appends never share or skip an id"
    );
}

async fn tip_id(store: &dyn VaultStore) -> i64 {
    store
        .audit_tip()
        .await
        .unwrap()
        .map_or(0, |tip| tip.last_id)
}

pub(super) async fn a_batch_gets_contiguous_ids_links_in_order_and_moves_the_tip_once(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    let start = tip_id(store).await;
    let before = all_rows(store)
        .await
        .last()
        .map(|r| r.hash)
        .unwrap_or([0; 32]);
    let events: Vec<AuditEvent> = (0..3)
        .map(|n| event(action::HTTP_CALL, Some("run-d"), 200 + n))
        .collect();
    let rows = store
        .audit_append_many(events.clone(), Arc::clone(chain))
        .await
        .expect("audit_append_many");
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        [start + 1, start + 2, start + 3],
        "V7: a batch takes the next ids in order"
    );
    let events_back: Vec<AuditEvent> = rows.iter().map(|r| r.event.clone()).collect();
    assert_eq!(events_back, events, "rows come back in the order given");
    let mut prev = before;
    for row in &rows {
        assert_eq!(
            row.prev_hash, prev,
            "row {} links to the row before it",
            row.id
        );
        assert_eq!(row.hash, chain.link(row.id, &row.event, &row.prev_hash));
        prev = row.hash;
    }
    let stored: Vec<AuditRow> = all_rows(store)
        .await
        .into_iter()
        .skip(start as usize)
        .collect();
    assert_eq!(stored, rows, "what the batch answered is what was stored");
    let tip = store.audit_tip().await.unwrap().expect("a tip");
    assert_eq!((tip.last_id, tip.last_hash), (start + 3, prev));
    assert_eq!(tip.anchor, chain.anchor(tip.last_id, &tip.last_hash));
}

pub(super) async fn an_empty_batch_writes_nothing(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
    let tip = store.audit_tip().await.unwrap();
    let rows = store
        .audit_append_many(Vec::new(), Arc::clone(chain))
        .await
        .expect("an empty batch is not an error");
    assert!(rows.is_empty());
    assert_eq!(store.audit_tip().await.unwrap(), tip);
}

pub(super) async fn a_batch_with_one_bad_row_writes_none_of_them(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    let before = all_rows(store).await;
    let tip = store.audit_tip().await.unwrap();
    // A duration beyond 63 bits cannot be stored by any backend.
    let bad = AuditEvent {
        duration_ms: u64::MAX,
        ..event(action::HTTP_CALL, None, 300)
    };
    let batch = vec![
        event(action::HTTP_CALL, None, 301),
        bad,
        event(action::HTTP_CALL, None, 302),
    ];
    assert!(
        store
            .audit_append_many(batch, Arc::clone(chain))
            .await
            .is_err(),
        "a row that cannot be stored fails its batch"
    );
    assert_eq!(
        all_rows(store).await,
        before,
        "a failed batch writes no row"
    );
    assert_eq!(
        store.audit_tip().await.unwrap(),
        tip,
        "a failed batch leaves the tip"
    );
}

pub(super) async fn concurrent_batches_and_single_appends_never_share_or_skip_an_id(
    store: &Arc<dyn VaultStore>,
    chain: &Arc<AuditChain>,
) {
    let start = tip_id(&**store).await;
    let tasks: Vec<_> = (0..6)
        .map(|task| {
            let (store, chain) = (Arc::clone(store), Arc::clone(chain));
            tokio::spawn(async move {
                for n in 0..5 {
                    if task % 2 == 0 {
                        let batch = (0..4)
                            .map(|k| {
                                event(action::HTTP_CALL, Some("run-e"), task * 100 + n * 10 + k)
                            })
                            .collect();
                        store
                            .audit_append_many(batch, Arc::clone(&chain))
                            .await
                            .unwrap();
                    } else {
                        store
                            .audit_append(
                                event(action::HTTP_CALL, Some("run-e"), task * 100 + n),
                                Arc::clone(&chain),
                            )
                            .await
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("append task");
    }
    // 3 batching tasks x 5 batches x 4 rows, 3 single tasks x 5 rows.
    let ids: Vec<i64> = all_rows(&**store).await.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        (1..=start + 75).collect::<Vec<_>>(),
        "V7: batches and single appends interleave without sharing or skipping an id"
    );
    let report = chain.verify(&**store).await.unwrap();
    assert!(report.intact, "{report:?}");
}

pub(super) async fn incomplete_intents_are_those_no_row_names(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    let intent = |n| event(action::HTTP_CALL_STARTED, Some("run-f"), n);
    let rows = store
        .audit_append_many(
            vec![intent(400), intent(401), intent(402)],
            Arc::clone(chain),
        )
        .await
        .unwrap();
    let (a, b, c) = (rows[0].id, rows[1].id, rows[2].id);
    let completion = AuditEvent {
        intent_id: Some(b),
        ..event(action::HTTP_CALL, Some("run-f"), 403)
    };
    append(store, chain, completion).await;
    assert_eq!(
        store.audit_incomplete(vec![c, a, b]).await.unwrap(),
        [a, c],
        "V7: an intent without a completion row is incomplete"
    );
    assert!(store.audit_incomplete(Vec::new()).await.unwrap().is_empty());
    let report = chain.verify(store).await.unwrap();
    assert_eq!(report.incomplete_calls, 2, "{report:?}");
}

pub(super) async fn an_untouched_log_verifies_intact(store: &dyn VaultStore, chain: &AuditChain) {
    let rows = all_rows(store).await.len() as i64;
    let report = chain.verify(store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, rows);
    assert_eq!(report.first_bad_row, None);
}

pub(super) async fn audit_counts_follow_appends(store: &dyn VaultStore) {
    let chain = std::sync::Arc::new(runwarden_vault::audit::AuditChain::from_audit_key(&[9; 32]));
    let count = |counts: &[(String, u64)], action: &str| {
        counts
            .iter()
            .find(|(a, _)| a == action)
            .map_or(0, |(_, n)| *n)
    };
    let before = store.audit_counts().await.unwrap();
    let event = |action: &str| runwarden_vault::AuditEvent {
        time_ms: 1,
        action: action.into(),
        success: false,
        secret: None,
        method: "GET".into(),
        host: "h".into(),
        path: "/".into(),
        status: 0,
        duration_ms: 0,
        error: None,
        reason: None,
        actor: "storetest".into(),
        correlation: None,
        intent_id: None,
    };
    store
        .audit_append(event("http_call"), chain.clone())
        .await
        .unwrap();
    // A batch counts each of its rows.
    store
        .audit_append_many(
            vec![event("http_call"), event("http_call_cancelled")],
            chain.clone(),
        )
        .await
        .unwrap();
    // Read before any fold: the rows after the last one folded are counted as they are.
    let after = store.audit_counts().await.unwrap();
    assert_eq!(count(&after, "http_call"), count(&before, "http_call") + 2);
    assert_eq!(
        count(&after, "http_call_cancelled"),
        count(&before, "http_call_cancelled") + 1
    );
    let mut sorted = after.clone();
    sorted.sort();
    assert_eq!(after, sorted, "ordered by action");
    // The counts agree with the rows themselves.
    let rows = store.audit_list(AuditFilter::default()).await.unwrap();
    for (action, n) in &after {
        let listed = rows.iter().filter(|r| &r.event.action == action).count() as u64;
        assert_eq!(*n, listed, "rows with action {action}");
    }
    // Folded two rows at a time, the counts read the same at every step, until a fold finds
    // nothing left.
    let mut folds = 0;
    loop {
        let folded = store.audit_counts_fold(2).await.unwrap();
        assert!(folded <= 2, "a fold added {folded} rows, at most 2 asked");
        assert_eq!(store.audit_counts().await.unwrap(), after);
        if folded == 0 {
            break;
        }
        folds += 1;
    }
    assert!(
        folds >= 2,
        "three new rows take two folds of two, took {folds}"
    );
    store
        .audit_append(event("http_call"), chain.clone())
        .await
        .unwrap();
    assert_eq!(store.audit_counts_fold(100).await.unwrap(), 1);
    assert_eq!(
        count(&store.audit_counts().await.unwrap(), "http_call"),
        count(&after, "http_call") + 1
    );
}
