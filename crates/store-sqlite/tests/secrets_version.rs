//! The secrets' version on one SQLite file: a vault on one connection sees a secret put
//! through another at once, and reading the version never queues behind a writer, not even
//! another process's transaction that holds the write lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_vault::store::{SealedKind, SealedRecord, VaultStore};

use crate::common::TempDb;

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_put_through_another_connection_is_searched_for_at_once() {
    let db = TempDb::new();
    runwarden_storetest::exercise_secret_freshness(Arc::new(db.open()), Arc::new(db.open())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_is_read_while_another_process_holds_the_write_lock() {
    let db = TempDb::new();
    let store = db.open();
    let before = store.sealed_secrets_version().await.unwrap();
    // Another process's write transaction, open and uncommitted: it holds the write lock.
    let other = db.raw();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
        .execute(
            "INSERT INTO sealed VALUES ('secret', 'pending', 'xchacha20poly1305', 1, 'mk-1', x'01', x'02', x'03', x'04', 1, 1)",
            [],
        )
        .unwrap();
    // This store's own writes now wait on the lock (its busy timeout is seconds), taking
    // both places of its write gate.
    let record = |name: &str| SealedRecord {
        kind: SealedKind::Internal,
        name: name.into(),
        algorithm: "xchacha20poly1305".into(),
        version: 1,
        master_key_id: "mk-1".into(),
        key_nonce: vec![1; 24],
        wrapped_key: vec![2; 48],
        value_nonce: vec![3; 24],
        ciphertext: vec![4],
        created_ms: 1,
        updated_ms: 1,
    };
    let mut writes: Vec<_> = ["w1", "w2", "w3"]
        .map(|name| {
            let (store, record) = (store.clone(), record(name));
            tokio::spawn(async move { store.sealed_put(record).await })
        })
        .into();
    // Give them time to reach the lock: the first one cannot answer before the commit.
    let waiting = tokio::time::timeout(Duration::from_millis(300), &mut writes[0]).await;
    assert!(waiting.is_err(), "a write went through the held lock");
    let started = Instant::now();
    let during = store.sealed_secrets_version().await.unwrap();
    let took = started.elapsed();
    assert!(
        writes.iter().all(|w| !w.is_finished()),
        "the writes were still waiting on the lock"
    );
    assert!(
        took < Duration::from_millis(1_000),
        "the version read waited {took:?} behind the writers"
    );
    assert_eq!(during, before, "an uncommitted put is not seen");
    other.execute_batch("COMMIT").unwrap();
    assert_ne!(
        store.sealed_secrets_version().await.unwrap(),
        before,
        "the other process's committed put is seen by the next read"
    );
    for write in writes {
        write.await.unwrap().unwrap();
    }
}
