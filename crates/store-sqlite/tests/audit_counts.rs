//! The audit rows by action that metrics read: kept beside the log by triggers, so they
//! follow every change to it, whoever makes it, and an upgraded database starts with the
//! rows it already holds counted.

use runwarden_vault::store::VaultStore;

use crate::common::{TempDb, chain, event};

fn rows(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
    counts.iter().map(|(a, n)| (a.to_string(), *n)).collect()
}

#[tokio::test]
async fn the_counts_follow_rows_written_removed_or_edited_by_hand() {
    let db = TempDb::new();
    let store = db.open();
    for n in 0..3 {
        store.audit_append(event(n), chain()).await.unwrap();
    }
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 3)])
    );

    // Another writer (an older build, a hand edit) goes around this store's code.
    let raw = db.raw();
    raw.execute_batch(
        "INSERT INTO audit_log (id, time_ms, action, success, method, host, path, status,
             duration_ms, actor, prev_hash, hash)
         VALUES (100, 1, 'proxy_connect', 1, 'CONNECT', 'h', '/', 0, 0, 'a', zeroblob(32), zeroblob(32));
         UPDATE audit_log SET action = 'edited' WHERE id = 1;
         DELETE FROM audit_log WHERE id = 2;",
    )
    .unwrap();
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("edited", 1), ("http_call", 1), ("proxy_connect", 1)])
    );

    // An emptied log reads 0 for each action it held, so the gauges go to 0.
    raw.execute_batch("DELETE FROM audit_log; DELETE FROM audit_tip;")
        .unwrap();
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("edited", 0), ("http_call", 0), ("proxy_connect", 0)])
    );
}

#[tokio::test]
async fn an_upgraded_database_starts_with_its_rows_counted() {
    let db = TempDb::new();
    let store = db.open();
    for n in 0..4 {
        store.audit_append(event(n), chain()).await.unwrap();
    }
    drop(store);
    // The schema as the build before the counts left it, with four rows in the log.
    db.raw()
        .execute_batch(
            "DROP TRIGGER audit_row_appended; DROP TRIGGER audit_row_removed;
             DROP TRIGGER audit_row_action_changed; DROP TABLE audit_counts;
             DELETE FROM schema_migrations WHERE version = 23;",
        )
        .unwrap();
    let store = db.open();
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 4)])
    );
    store.audit_append(event(5), chain()).await.unwrap();
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 5)])
    );
}
