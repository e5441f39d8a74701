//! The `VaultStore` conformance checks: sealed records first, then the audit log.

use std::sync::{Arc, Mutex};

use runwarden_vault::audit::{AuditChain, AuditEvent, AuditRow, action};
use runwarden_vault::store::{
    AuditFilter, SealedKind, SealedMeta, SealedRecord, StoreError, VaultStore,
};

/// Runs every check against `store`, which must be fresh and empty. Panics on the first
/// property that does not hold.
pub async fn exercise_vault_store(store: Arc<dyn VaultStore>) {
    let s = &*store;
    get_of_a_missing_record_is_none(s).await;
    put_then_get_returns_every_field(s).await;
    put_keeps_created_time_on_replace(s).await;
    insert_new_never_overwrites(s).await;
    kinds_are_separate_namespaces(s).await;
    delete_reports_whether_a_record_existed(s).await;
    list_is_ordered_by_name_and_holds_one_kind(s).await;
    list_never_returns_ciphertext(s).await;
    rewrap_is_all_or_nothing(s).await;
    rewrap_reaches_every_record_of_every_kind(s).await;
    an_oauth_refresh_lease_has_one_holder_until_it_expires_or_is_released(s).await;

    let chain = Arc::new(AuditChain::from_audit_key(&[42u8; 32]));
    an_empty_log_has_no_rows_no_tip_and_verifies(s, &chain).await;
    audit_ids_are_contiguous_from_one(s, &chain).await;
    audit_rows_link_to_their_predecessor(s, &chain).await;
    audit_tip_tracks_the_newest_row(s, &chain).await;
    audit_rows_return_every_field(s, &chain).await;
    audit_filter_by_action_and_correlation(s, &chain).await;
    audit_filter_after_id_newest_first_and_limit(s).await;
    concurrent_appends_get_contiguous_ids(&store, &chain).await;
    a_batch_gets_contiguous_ids_links_in_order_and_moves_the_tip_once(s, &chain).await;
    an_empty_batch_writes_nothing(s, &chain).await;
    a_batch_with_one_bad_row_writes_none_of_them(s, &chain).await;
    concurrent_batches_and_single_appends_never_share_or_skip_an_id(&store, &chain).await;
    incomplete_intents_are_those_no_row_names(s, &chain).await;
    an_untouched_log_verifies_intact(s, &chain).await;
    // Last: it appends rows, and earlier checks need an empty log.
    audit_counts_follow_appends(s).await;
    // After the log's checks: it appends a row with the same chain key.
    crate::secrets_version::the_secrets_version_moves_with_every_change_to_a_secret(s, &chain)
        .await;
}

fn record(kind: SealedKind, name: &str, time_ms: i64) -> SealedRecord {
    SealedRecord {
        kind,
        name: name.into(),
        algorithm: "xchacha20poly1305".into(),
        version: 1,
        master_key_id: "mk-1".into(),
        key_nonce: vec![1; 24],
        wrapped_key: vec![2; 48],
        value_nonce: vec![3; 24],
        ciphertext: format!("sealed {name}").into_bytes(),
        created_ms: time_ms,
        updated_ms: time_ms,
    }
}

async fn get(store: &dyn VaultStore, kind: SealedKind, name: &str) -> Option<SealedRecord> {
    store.sealed_get(kind, name).await.expect("sealed_get")
}

async fn get_of_a_missing_record_is_none(store: &dyn VaultStore) {
    assert_eq!(get(store, SealedKind::Secret, "nope").await, None);
    assert!(
        store
            .sealed_list(SealedKind::Secret)
            .await
            .unwrap()
            .is_empty(),
        "the suite needs an empty store"
    );
}

async fn put_then_get_returns_every_field(store: &dyn VaultStore) {
    let mut original = record(SealedKind::Secret, "roundtrip", 1_000);
    original.algorithm = "aes256gcm".into();
    original.version = u32::MAX;
    original.key_nonce = (0..=255).collect();
    original.ciphertext = Vec::new();
    original.updated_ms = i64::MAX;
    store.sealed_put(original.clone()).await.unwrap();
    assert_eq!(
        get(store, SealedKind::Secret, "roundtrip").await,
        Some(original)
    );
    assert!(
        store
            .sealed_delete(SealedKind::Secret, "roundtrip")
            .await
            .unwrap()
    );
}

async fn put_keeps_created_time_on_replace(store: &dyn VaultStore) {
    store
        .sealed_put(record(SealedKind::Secret, "replaced", 1_000))
        .await
        .unwrap();
    let mut newer = record(SealedKind::Secret, "replaced", 5_000);
    newer.ciphertext = b"new value".to_vec();
    store.sealed_put(newer.clone()).await.unwrap();
    let stored = get(store, SealedKind::Secret, "replaced").await.unwrap();
    assert_eq!(
        stored.created_ms, 1_000,
        "a replace keeps the original creation time"
    );
    assert_eq!(stored.updated_ms, 5_000);
    assert_eq!(stored.ciphertext, b"new value");
    assert!(
        store
            .sealed_delete(SealedKind::Secret, "replaced")
            .await
            .unwrap()
    );
}

async fn insert_new_never_overwrites(store: &dyn VaultStore) {
    let first = record(SealedKind::Internal, "audit_key", 1_000);
    assert!(store.sealed_insert_new(first.clone()).await.unwrap());
    let mut second = record(SealedKind::Internal, "audit_key", 2_000);
    second.ciphertext = b"another key".to_vec();
    assert!(
        !store.sealed_insert_new(second).await.unwrap(),
        "a second insert reports that nothing was inserted"
    );
    assert_eq!(
        get(store, SealedKind::Internal, "audit_key").await,
        Some(first)
    );
    assert!(
        store
            .sealed_delete(SealedKind::Internal, "audit_key")
            .await
            .unwrap()
    );
}

async fn kinds_are_separate_namespaces(store: &dyn VaultStore) {
    let secret = record(SealedKind::Secret, "shared", 1);
    let mut internal = record(SealedKind::Internal, "shared", 2);
    internal.ciphertext = b"internal".to_vec();
    store.sealed_put(secret.clone()).await.unwrap();
    assert!(store.sealed_insert_new(internal.clone()).await.unwrap());
    assert_eq!(get(store, SealedKind::Secret, "shared").await, Some(secret));
    assert!(
        store
            .sealed_delete(SealedKind::Secret, "shared")
            .await
            .unwrap()
    );
    assert_eq!(
        get(store, SealedKind::Internal, "shared").await,
        Some(internal)
    );
    assert!(
        store
            .sealed_delete(SealedKind::Internal, "shared")
            .await
            .unwrap()
    );
}

async fn delete_reports_whether_a_record_existed(store: &dyn VaultStore) {
    store
        .sealed_put(record(SealedKind::Secret, "doomed", 1))
        .await
        .unwrap();
    assert!(
        store
            .sealed_delete(SealedKind::Secret, "doomed")
            .await
            .unwrap()
    );
    assert!(
        !store
            .sealed_delete(SealedKind::Secret, "doomed")
            .await
            .unwrap()
    );
    assert_eq!(get(store, SealedKind::Secret, "doomed").await, None);
}

async fn list_is_ordered_by_name_and_holds_one_kind(store: &dyn VaultStore) {
    for name in ["charlie", "alpha", "bravo"] {
        store
            .sealed_put(record(SealedKind::Secret, name, 10))
            .await
            .unwrap();
    }
    store
        .sealed_put(record(SealedKind::Internal, "audit_key", 20))
        .await
        .unwrap();
    let names: Vec<String> = store
        .sealed_list(SealedKind::Secret)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["alpha", "bravo", "charlie"]);
    let internal = store.sealed_list(SealedKind::Internal).await.unwrap();
    assert_eq!(internal.len(), 1);
    assert_eq!(internal[0].name, "audit_key");
}

async fn list_never_returns_ciphertext(store: &dyn VaultStore) {
    for meta in store.sealed_list(SealedKind::Secret).await.unwrap() {
        // V2: listing yields metadata only. The exhaustive pattern stops compiling if
        // anyone adds a field (say, ciphertext) to `SealedMeta`.
        let SealedMeta {
            name,
            algorithm,
            created_ms,
            updated_ms,
        } = meta;
        let stored = get(store, SealedKind::Secret, &name).await.unwrap();
        assert_eq!(
            (algorithm, created_ms, updated_ms),
            (stored.algorithm, stored.created_ms, stored.updated_ms)
        );
    }
}

/// Every record the sealed checks above leave behind, in (kind, name) order.
async fn remaining_records(store: &dyn VaultStore) -> Vec<SealedRecord> {
    let mut all = Vec::new();
    for (kind, name) in [
        (SealedKind::Internal, "audit_key"),
        (SealedKind::Secret, "alpha"),
        (SealedKind::Secret, "bravo"),
        (SealedKind::Secret, "charlie"),
    ] {
        all.push(
            get(store, kind, name)
                .await
                .expect("the listing checks left this record"),
        );
    }
    all
}

async fn rewrap_is_all_or_nothing(store: &dyn VaultStore) {
    let before = remaining_records(store).await;
    let mut seen = 0;
    let outcome = store
        .sealed_rewrap_all(Box::new(move |mut record| {
            seen += 1;
            if seen == 3 {
                return Err(StoreError::new(
                    "rewrapping a data key",
                    "the old master key does not open it",
                ));
            }
            record.master_key_id = "mk-2".into();
            record.wrapped_key.reverse();
            Ok(record)
        }))
        .await;
    let error = outcome.expect_err("the failing rewrap must fail the rotation");
    assert_eq!(
        error.message, "the old master key does not open it",
        "the closure's error comes back as it was"
    );
    // V1: rotation is atomic; the two records rewrapped before the failure are rolled back.
    assert_eq!(remaining_records(store).await, before);
}

async fn rewrap_reaches_every_record_of_every_kind(store: &dyn VaultStore) {
    let before = remaining_records(store).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_closure = Arc::clone(&seen);
    let count = store
        .sealed_rewrap_all(Box::new(move |mut record| {
            seen_in_closure
                .lock()
                .unwrap()
                .push((record.kind, record.name.clone()));
            record.master_key_id = "mk-2".into();
            record.key_nonce = vec![9; 24];
            record.wrapped_key.reverse();
            record.updated_ms += 1;
            Ok(record)
        }))
        .await
        .unwrap();
    assert_eq!(count, before.len());
    assert_eq!(seen.lock().unwrap().len(), before.len());
    for old in before {
        let new = get(store, old.kind, &old.name).await.unwrap();
        assert_eq!(new.master_key_id, "mk-2");
        assert_eq!(new.key_nonce, vec![9; 24]);
        assert_eq!(new.updated_ms, old.updated_ms + 1);
        assert_eq!(new.created_ms, old.created_ms);
        assert_eq!(
            new.ciphertext, old.ciphertext,
            "rotation rewraps data keys only"
        );
    }
}

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

async fn an_empty_log_has_no_rows_no_tip_and_verifies(store: &dyn VaultStore, chain: &AuditChain) {
    assert!(
        all_rows(store).await.is_empty(),
        "the suite needs an empty audit log"
    );
    assert_eq!(store.audit_tip().await.unwrap(), None);
    let report = chain.verify(store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, 0);
}

async fn audit_ids_are_contiguous_from_one(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
    for n in 1..=5 {
        let row = append(store, chain, event(action::HTTP_CALL, Some("run-a"), n)).await;
        assert_eq!(row.id, n, "V7: ids start at 1 and grow by one");
    }
    let ids: Vec<i64> = all_rows(store).await.iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
}

async fn audit_rows_link_to_their_predecessor(store: &dyn VaultStore, chain: &AuditChain) {
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

async fn audit_tip_tracks_the_newest_row(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
    let row = append(store, chain, event(action::HTTP_CALL_REFUSED, None, 6)).await;
    let tip = store
        .audit_tip()
        .await
        .unwrap()
        .expect("a tip after an append");
    assert_eq!((tip.last_id, tip.last_hash), (row.id, row.hash));
    assert_eq!(tip.anchor, chain.anchor(row.id, &row.hash));
}

async fn audit_rows_return_every_field(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
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

async fn audit_filter_by_action_and_correlation(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
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

async fn audit_filter_after_id_newest_first_and_limit(store: &dyn VaultStore) {
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

async fn concurrent_appends_get_contiguous_ids(
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

async fn a_batch_gets_contiguous_ids_links_in_order_and_moves_the_tip_once(
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

async fn an_empty_batch_writes_nothing(store: &dyn VaultStore, chain: &Arc<AuditChain>) {
    let tip = store.audit_tip().await.unwrap();
    let rows = store
        .audit_append_many(Vec::new(), Arc::clone(chain))
        .await
        .expect("an empty batch is not an error");
    assert!(rows.is_empty());
    assert_eq!(store.audit_tip().await.unwrap(), tip);
}

async fn a_batch_with_one_bad_row_writes_none_of_them(
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

async fn concurrent_batches_and_single_appends_never_share_or_skip_an_id(
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

async fn incomplete_intents_are_those_no_row_names(
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

async fn an_untouched_log_verifies_intact(store: &dyn VaultStore, chain: &AuditChain) {
    let rows = all_rows(store).await.len() as i64;
    let report = chain.verify(store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, rows);
    assert_eq!(report.first_bad_row, None);
}

async fn audit_counts_follow_appends(store: &dyn VaultStore) {
    let chain = std::sync::Arc::new(runwarden_vault::audit::AuditChain::from_audit_key(&[9; 32]));
    let before = store.audit_counts().await.unwrap();
    let count = |counts: &[(String, u64)], action: &str| {
        counts
            .iter()
            .find(|(a, _)| a == action)
            .map_or(0, |(_, n)| *n)
    };
    for action in ["http_call", "http_call", "http_call_cancelled"] {
        let event = runwarden_vault::AuditEvent {
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
        store.audit_append(event, chain.clone()).await.unwrap();
    }
    let after = store.audit_counts().await.unwrap();
    assert_eq!(count(&after, "http_call"), count(&before, "http_call") + 2);
    assert_eq!(
        count(&after, "http_call_cancelled"),
        count(&before, "http_call_cancelled") + 1
    );
}

/// M18: one refresh of a token at a time across processes: the lease has one holder until
/// it expires or is released, its holder may extend it, and a stale release is ignored.
async fn an_oauth_refresh_lease_has_one_holder_until_it_expires_or_is_released(s: &dyn VaultStore) {
    let key = "oauth.lease-check";
    assert!(
        s.oauth_lease_acquire(key, "a", 1_000, 31_000)
            .await
            .unwrap()
    );
    assert!(
        !s.oauth_lease_acquire(key, "b", 2_000, 32_000)
            .await
            .unwrap(),
        "a held lease is not taken"
    );
    assert!(
        s.oauth_lease_acquire(key, "a", 3_000, 33_000)
            .await
            .unwrap(),
        "its holder extends it"
    );
    assert!(
        s.oauth_lease_acquire("oauth.other", "b", 3_000, 33_000)
            .await
            .unwrap(),
        "leases are per key"
    );
    assert!(
        s.oauth_lease_acquire(key, "b", 33_000, 63_000)
            .await
            .unwrap(),
        "an expired lease is taken over"
    );
    s.oauth_lease_release(key, "a").await.unwrap();
    assert!(
        !s.oauth_lease_acquire(key, "c", 34_000, 64_000)
            .await
            .unwrap(),
        "a stale holder's release leaves the new holder's lease"
    );
    s.oauth_lease_release(key, "b").await.unwrap();
    assert!(
        s.oauth_lease_acquire(key, "c", 35_000, 65_000)
            .await
            .unwrap(),
        "a released lease is free"
    );
    s.oauth_lease_release(key, "c").await.unwrap();
    s.oauth_lease_release("oauth.other", "b").await.unwrap();
}
