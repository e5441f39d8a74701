//! The audit rows by action that metrics read: counts kept beside the log, which folds
//! bring up to date. They follow every row, whoever writes it, a log wiped by hand is
//! counted again, and an upgraded database starts with the rows it holds counted.

use runwarden_vault::store::VaultStore;

use crate::common::{TempDb, chain, event};

fn rows(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
    counts.iter().map(|(a, n)| (a.to_string(), *n)).collect()
}

/// Inserts an audit row as another writer would (an older build, a hand edit).
const RAW_ROW: &str = "INSERT INTO audit_log (id, time_ms, action, success, method, host,
         path, status, duration_ms, actor, prev_hash, hash)
     VALUES (?1, 1, ?2, 1, 'CONNECT', 'h', '/', 0, 0, 'a', zeroblob(32), zeroblob(32))";

#[tokio::test]
async fn the_counts_follow_rows_written_removed_or_edited_by_hand() {
    let db = TempDb::new();
    let store = db.open();
    for n in 0..3 {
        store.audit_append(event(n), chain()).await.unwrap();
    }
    assert_eq!(store.audit_counts_fold(10).await.unwrap(), 3);
    let raw = db.raw();
    // Another writer goes around this store's code: its row is counted as it comes.
    raw.execute(RAW_ROW, (100, "proxy_connect")).unwrap();
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 3), ("proxy_connect", 1)])
    );
    // Rows already folded, edited or removed, leave the counts; so do rows not folded yet
    // (no row has had its action since, so it is not listed).
    raw.execute_batch(
        "UPDATE audit_log SET action = 'edited' WHERE id = 1;
         DELETE FROM audit_log WHERE id = 2;
         DELETE FROM audit_log WHERE id = 100;",
    )
    .unwrap();
    let expected = rows(&[("edited", 1), ("http_call", 1)]);
    assert_eq!(store.audit_counts().await.unwrap(), expected);
    store.audit_counts_fold(10).await.unwrap();
    assert_eq!(store.audit_counts().await.unwrap(), expected);
}

#[tokio::test]
async fn a_log_wiped_by_hand_is_counted_again_from_its_start() {
    let db = TempDb::new();
    let store = db.open();
    for n in 0..5 {
        store.audit_append(event(n), chain()).await.unwrap();
    }
    assert_eq!(store.audit_counts_fold(10).await.unwrap(), 5);
    // Wiped, the log starts again at id 1, below the last row folded.
    db.raw()
        .execute_batch("DELETE FROM audit_log; DELETE FROM audit_tip;")
        .unwrap();
    store.audit_append(event(9), chain()).await.unwrap();
    assert_eq!(store.audit_counts_fold(10).await.unwrap(), 1);
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 1)])
    );
    // Restored from another copy: the row at the last id folded has another hash.
    let raw = db.raw();
    raw.execute_batch("DELETE FROM audit_log; DELETE FROM audit_tip;")
        .unwrap();
    for id in [1, 2] {
        raw.execute(RAW_ROW, (id, "proxy_connect")).unwrap();
    }
    assert_eq!(store.audit_counts_fold(10).await.unwrap(), 2);
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 0), ("proxy_connect", 2)])
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
    db.schema_back_to(22);
    let store = db.open();
    let counted: (i64, i64) = db
        .raw()
        .query_row(
            "SELECT (SELECT n FROM audit_counts WHERE action = 'http_call'), through_id
             FROM audit_counted",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(counted, (4, 4), "the upgrade counted the four rows");
    assert_eq!(store.audit_counts_fold(10).await.unwrap(), 0);
    store.audit_append(event(5), chain()).await.unwrap();
    assert_eq!(
        store.audit_counts().await.unwrap(),
        rows(&[("http_call", 5)])
    );
}

#[tokio::test]
async fn a_scrape_folds_a_long_log_in_bounded_steps() {
    let db = TempDb::new();
    let store = db.open();
    // More rows than one fold takes (20,000): six full folds and part of a seventh.
    db.raw()
        .execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 120001)
             INSERT INTO audit_log (id, time_ms, action, success, method, host, path, status,
                 duration_ms, actor, prev_hash, hash)
             SELECT i, 1, CASE i % 3 WHEN 0 THEN 'proxy_connect' ELSE 'http_call' END, 1,
                 'GET', 'h', '/', 200, 1, 'a', zeroblob(32), randomblob(32)
             FROM n",
            [],
        )
        .unwrap();
    assert_eq!(
        runwarden_vault::store::audit_rows_by_action(&store)
            .await
            .unwrap(),
        rows(&[("http_call", 80_001), ("proxy_connect", 40_000)])
    );
    let through: i64 = db
        .raw()
        .query_row("SELECT through_id FROM audit_counted", [], |row| row.get(0))
        .unwrap();
    assert_eq!(through, 120_001, "every row folded");
    assert_eq!(store.audit_counts_fold(20_000).await.unwrap(), 0);
}

#[tokio::test]
async fn a_scrape_that_cannot_fold_still_counts_every_row() {
    let db = TempDb::new();
    let store = db.open();
    for n in 0..3 {
        store.audit_append(event(n), chain()).await.unwrap();
    }
    // Another process holds the write lock past the store's busy timeout: the fold fails.
    let other = db.raw();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(
        store.audit_counts_fold(10).await.is_err(),
        "the fold took the lock"
    );
    assert_eq!(
        runwarden_vault::store::audit_rows_by_action(&store)
            .await
            .unwrap(),
        rows(&[("http_call", 3)])
    );
    other.execute_batch("COMMIT").unwrap();
    assert_eq!(store.audit_counts_fold(10).await.unwrap(), 3);
}
