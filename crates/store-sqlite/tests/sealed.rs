//! Sealed records on a real file: atomic rotation checked byte for byte, and persistence.

use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::store::{SealedKind, SealedRecord, StoreError, VaultStore};

use crate::common::TempDb;

fn record(kind: SealedKind, name: &str) -> SealedRecord {
    SealedRecord {
        kind,
        name: name.into(),
        algorithm: "xchacha20poly1305".into(),
        version: 1,
        master_key_id: "mk-1".into(),
        key_nonce: vec![1; 24],
        wrapped_key: vec![2; 48],
        value_nonce: vec![3; 24],
        ciphertext: name.as_bytes().to_vec(),
        created_ms: 10,
        updated_ms: 20,
    }
}

/// Every column of every sealed row, read through a raw connection.
fn raw_snapshot(db: &TempDb) -> Vec<Vec<rusqlite::types::Value>> {
    let conn = db.raw();
    let mut stmt = conn
        .prepare("SELECT * FROM sealed ORDER BY kind, name")
        .unwrap();
    let columns = stmt.column_count();
    stmt.query_map([], |row| (0..columns).map(|i| row.get(i)).collect())
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewrap_failing_on_the_third_record_leaves_every_record_byte_identical() {
    let db = TempDb::new();
    let store = db.open();
    for name in ["a", "b", "c", "d"] {
        store
            .sealed_put(record(SealedKind::Secret, name))
            .await
            .unwrap();
    }
    store
        .sealed_put(record(SealedKind::Internal, "audit_key"))
        .await
        .unwrap();
    let before = raw_snapshot(&db);
    let mut seen = 0;
    let error = store
        .sealed_rewrap_all(Box::new(move |mut record| {
            seen += 1;
            if seen == 3 {
                return Err(StoreError::new("rewrapping a data key", "wrong master key"));
            }
            record.wrapped_key = vec![0xee; 48];
            record.master_key_id = "mk-2".into();
            Ok(record)
        }))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "store error while rewrapping a data key: wrong master key"
    );
    assert_eq!(raw_snapshot(&db), before, "V1: rotation is atomic");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewrap_that_renames_a_record_is_refused_and_rolled_back() {
    let db = TempDb::new();
    let store = db.open();
    store
        .sealed_put(record(SealedKind::Secret, "a"))
        .await
        .unwrap();
    let before = raw_snapshot(&db);
    let error = store
        .sealed_rewrap_all(Box::new(|mut record| {
            record.name.push('!');
            Ok(record)
        }))
        .await
        .unwrap_err();
    assert!(
        error.message.contains("another record's kind or name"),
        "{error}"
    );
    assert_eq!(raw_snapshot(&db), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn records_survive_closing_and_reopening_the_file() {
    let db = TempDb::new();
    db.open()
        .sealed_put(record(SealedKind::Secret, "kept"))
        .await
        .unwrap();
    let reopened = SqliteStore::open_existing(&db.path).unwrap();
    assert_eq!(
        reopened
            .sealed_get(SealedKind::Secret, "kept")
            .await
            .unwrap(),
        Some(record(SealedKind::Secret, "kept"))
    );
    assert_eq!(reopened.path(), db.path);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_of_unknown_kind_reads_back_as_an_error_not_a_panic() {
    let db = TempDb::new();
    let store = db.open();
    store
        .sealed_put(record(SealedKind::Secret, "a"))
        .await
        .unwrap();
    db.raw()
        .execute("UPDATE sealed SET kind = 'bogus'", [])
        .unwrap();
    let error = store.sealed_rewrap_all(Box::new(Ok)).await.unwrap_err();
    assert!(error.message.contains("unknown kind"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_token_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = runwarden_store_sqlite::SqliteStore::open(dir.path().join("tokens.db")).unwrap();
    runwarden_storetest::exercise_token_store(std::sync::Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_session_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = runwarden_store_sqlite::SqliteStore::open(dir.path().join("sessions.db")).unwrap();
    runwarden_storetest::exercise_session_store(std::sync::Arc::new(store)).await;
}
