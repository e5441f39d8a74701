//! A call's outcome row is committed on the caller's own thread when the write connection
//! is free (`quick_write`). What must hold there: another process's write lock never
//! stalls that thread, and the checkpoints it leaves to the blocking pool never let the
//! WAL grow without bound, even on a runtime with one thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::audit::{AuditChain, AuditEvent};
use runwarden_vault::store::VaultStore;

use crate::common::{TempDb, chain, event};

/// An outcome row of the intent `intent_id`: it is not synced, so it is a quick write.
fn outcome(n: i64, intent_id: i64) -> AuditEvent {
    AuditEvent {
        intent_id: Some(intent_id),
        ..event(n)
    }
}

/// A store on a fresh file whose log holds one intent (row 1, synced on the pool).
async fn with_an_intent() -> (TempDb, SqliteStore, Arc<AuditChain>, i64) {
    let db = TempDb::new();
    let store = db.open();
    let chain = chain();
    let rows = store
        .audit_append_many(vec![event(1)], chain.clone())
        .await
        .unwrap();
    assert_eq!(rows[0].id, 1);
    (db, store, chain, rows[0].id)
}

/// On a runtime with one thread (the test's), an outcome row whose write lock another
/// process holds goes to the pool and waits there; the thread answers at once.
#[tokio::test]
async fn another_processs_write_lock_never_holds_the_callers_thread() {
    let (db, store, chain, intent) = with_an_intent().await;
    let other = db.raw();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let writing = tokio::spawn({
        let (store, chain) = (store.clone(), chain.clone());
        async move {
            store
                .audit_append_many(vec![outcome(2, intent)], chain)
                .await
        }
    });
    let yielded = Instant::now();
    tokio::task::yield_now().await;
    // The busy timeout is five seconds: a write that waited here would take that long.
    let held = yielded.elapsed();
    assert!(
        held < Duration::from_secs(2),
        "the runtime's thread was held {held:?}"
    );
    assert!(!writing.is_finished());
    other.execute_batch("COMMIT").unwrap();
    let rows = tokio::time::timeout(Duration::from_secs(30), writing)
        .await
        .expect("the row was written once the lock was free")
        .unwrap()
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, 2);
    let report = chain.verify(&store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, 2);
}

/// A runtime with one thread runs the pool's checkpoint only when its caller yields, and
/// a quick write never does: the WAL must still stay bounded (at four times SQLite's
/// automatic checkpoint, then it checkpoints where it is).
#[tokio::test]
async fn quick_writes_on_a_runtime_with_one_thread_keep_the_wal_bounded() {
    const ROWS: i64 = 4_000;
    /// 4,000 pages and a batch's worth, at 4,096 bytes a page and 24 a frame header.
    const MOST_BYTES: u64 = 4_100 * (4_096 + 24) + 32;
    let (db, store, chain, intent) = with_an_intent().await;
    let wal = db.path.with_extension("db-wal");
    let mut largest = 0;
    for n in 1..=ROWS {
        store
            .audit_append_many(vec![outcome(n + 1, intent)], chain.clone())
            .await
            .unwrap();
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    assert!(
        largest <= MOST_BYTES,
        "the WAL grew to {largest} bytes over {ROWS} rows"
    );
    // Past 1,000 pages the checkpoint was left to the pool, not run in a quick write.
    assert!(
        largest > 2_000 * (4_096 + 24),
        "the WAL never passed 2,000 pages ({largest} bytes): a quick write checkpointed"
    );
    let report = chain.verify(&store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, ROWS + 1);
}
