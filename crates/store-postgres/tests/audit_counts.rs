//! The audit rows by action that metrics read: kept beside the log by triggers, so they
//! follow every change to it, from any node or session, and an upgraded database starts
//! with the rows it already holds counted.

use std::sync::Arc;

use runwarden_vault::audit::AuditChain;
use runwarden_vault::store::VaultStore;

use crate::common::{TestDb, audit_event};

fn rows(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
    counts.iter().map(|(a, n)| (a.to_string(), *n)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_counts_follow_rows_written_removed_or_edited_by_hand() {
    let db = TestDb::new().await;
    let (one, two) = (db.node().await, db.node().await);
    let chain = Arc::new(AuditChain::from_audit_key(&[7; 32]));
    for store in [&one, &two, &one] {
        store
            .audit_append(audit_event(), chain.clone())
            .await
            .unwrap();
    }
    assert_eq!(two.audit_counts_fold(10).await.unwrap(), 3);
    assert_eq!(one.audit_counts().await.unwrap(), rows(&[("http_call", 3)]));

    // Another session (an older node, a hand edit) goes around the store's code: its row
    // is counted as it comes.
    let raw = db.session().await;
    raw.batch_execute(
        "INSERT INTO audit_log (id, time_ms, action, success, method, host, path, status,
             duration_ms, actor, prev_hash, hash)
         VALUES (100, 1, 'proxy_connect', true, 'CONNECT', 'h', '/', 0, 0, 'a', '\\x00', '\\x00')",
    )
    .await
    .unwrap();
    assert_eq!(
        two.audit_counts().await.unwrap(),
        rows(&[("http_call", 3), ("proxy_connect", 1)])
    );
    // Rows already folded, edited or removed, leave the counts; so do rows not folded yet.
    raw.batch_execute(
        "UPDATE audit_log SET action = 'edited' WHERE id = 1;
         DELETE FROM audit_log WHERE id IN (2, 100);",
    )
    .await
    .unwrap();
    let expected = rows(&[("edited", 1), ("http_call", 1)]);
    assert_eq!(two.audit_counts().await.unwrap(), expected);
    one.audit_counts_fold(10).await.unwrap();
    assert_eq!(two.audit_counts().await.unwrap(), expected);

    // Emptied, and written again from id 1, below the last row folded: counted again.
    raw.batch_execute("TRUNCATE audit_log, audit_tip")
        .await
        .unwrap();
    assert_eq!(
        two.audit_counts().await.unwrap(),
        rows(&[("edited", 0), ("http_call", 0)])
    );
    one.audit_append(audit_event(), chain.clone())
        .await
        .unwrap();
    assert_eq!(one.audit_counts_fold(10).await.unwrap(), 1);
    assert_eq!(
        two.audit_counts().await.unwrap(),
        rows(&[("edited", 0), ("http_call", 1)])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn folds_on_two_nodes_at_once_count_each_row_once() {
    let db = TestDb::new().await;
    let (one, two) = (db.node().await, db.node().await);
    let chain = Arc::new(AuditChain::from_audit_key(&[7; 32]));
    for _ in 0..40 {
        one.audit_append(audit_event(), chain.clone())
            .await
            .unwrap();
    }
    let fold_all = |store: Arc<runwarden_store_postgres::PgStore>| async move {
        while store.audit_counts_fold(3).await.unwrap() > 0 {}
    };
    tokio::join!(fold_all(one.clone()), fold_all(two.clone()));
    // A node that finds the other folding stops: one more pass, alone, folds what is left.
    fold_all(one.clone()).await;
    assert_eq!(
        one.audit_counts().await.unwrap(),
        rows(&[("http_call", 40)])
    );
    let (through, n): (i64, i64) = {
        let row = db
            .session()
            .await
            .query_one(
                "SELECT through_id, (SELECT n FROM audit_counts WHERE action = 'http_call')
                 FROM audit_counted",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((through, n), (40, 40), "every row folded, once");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgraded_database_starts_with_its_rows_counted() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let chain = Arc::new(AuditChain::from_audit_key(&[7; 32]));
    for _ in 0..4 {
        store
            .audit_append(audit_event(), chain.clone())
            .await
            .unwrap();
    }
    // The schema as the build before the counts left it, with four rows in the log.
    db.schema_back_to(22).await;
    let upgraded = db.node().await;
    let row = db
        .session()
        .await
        .query_one(
            "SELECT (SELECT n FROM audit_counts WHERE action = 'http_call'), through_id
             FROM audit_counted",
            &[],
        )
        .await
        .unwrap();
    let counted: (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(counted, (4, 4), "the upgrade counted the four rows");
    assert_eq!(upgraded.audit_counts_fold(10).await.unwrap(), 0);
    upgraded.audit_append(audit_event(), chain).await.unwrap();
    assert_eq!(
        upgraded.audit_counts().await.unwrap(),
        rows(&[("http_call", 5)])
    );
}
