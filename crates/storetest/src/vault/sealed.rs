//! Sealed records: put, get, insert, delete, list and the all-or-nothing rewrap.

use super::*;

pub(super) async fn get_of_a_missing_record_is_none(store: &dyn VaultStore) {
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

pub(super) async fn put_then_get_returns_every_field(store: &dyn VaultStore) {
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

pub(super) async fn put_keeps_created_time_on_replace(store: &dyn VaultStore) {
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

pub(super) async fn insert_new_never_overwrites(store: &dyn VaultStore) {
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

pub(super) async fn kinds_are_separate_namespaces(store: &dyn VaultStore) {
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

pub(super) async fn delete_reports_whether_a_record_existed(store: &dyn VaultStore) {
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

pub(super) async fn list_is_ordered_by_name_and_holds_one_kind(store: &dyn VaultStore) {
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

pub(super) async fn list_never_returns_ciphertext(store: &dyn VaultStore) {
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

pub(super) async fn rewrap_is_all_or_nothing(store: &dyn VaultStore) {
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

pub(super) async fn rewrap_reaches_every_record_of_every_kind(store: &dyn VaultStore) {
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
