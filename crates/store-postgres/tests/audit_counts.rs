//! The audit rows by action that metrics read: kept beside the log by triggers, so they
//! follow every change to it, from any node or session, and an upgraded database starts
//! with the rows it already holds counted.

use std::sync::Arc;

use runwarden_vault::audit::{AuditChain, AuditEvent};
use runwarden_vault::store::VaultStore;

use crate::common::TestDb;

fn rows(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
    counts.iter().map(|(a, n)| (a.to_string(), *n)).collect()
}

fn event() -> AuditEvent {
    AuditEvent {
        time_ms: 1,
        action: "http_call".into(),
        success: true,
        secret: None,
        method: "GET".into(),
        host: "h".into(),
        path: "/".into(),
        status: 200,
        duration_ms: 1,
        error: None,
        reason: None,
        actor: "test".into(),
        correlation: None,
        intent_id: None,
    }
}

async fn session(db: &TestDb) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread")]
async fn the_counts_follow_rows_written_removed_or_edited_by_hand() {
    let db = TestDb::new().await;
    let (one, two) = (db.node().await, db.node().await);
    let chain = Arc::new(AuditChain::from_audit_key(&[7; 32]));
    for store in [&one, &two, &one] {
        store.audit_append(event(), chain.clone()).await.unwrap();
    }
    assert_eq!(one.audit_counts().await.unwrap(), rows(&[("http_call", 3)]));

    // Another session (an older node, a hand edit) goes around the store's code.
    let raw = session(&db).await;
    raw.batch_execute(
        "INSERT INTO audit_log (id, time_ms, action, success, method, host, path, status,
             duration_ms, actor, prev_hash, hash)
         VALUES (100, 1, 'proxy_connect', true, 'CONNECT', 'h', '/', 0, 0, 'a', '\\x00', '\\x00');
         UPDATE audit_log SET action = 'edited' WHERE id = 1;
         DELETE FROM audit_log WHERE id = 2;",
    )
    .await
    .unwrap();
    assert_eq!(
        two.audit_counts().await.unwrap(),
        rows(&[("edited", 1), ("http_call", 1), ("proxy_connect", 1)])
    );

    raw.batch_execute("DELETE FROM audit_log WHERE action <> 'edited'")
        .await
        .unwrap();
    assert_eq!(
        two.audit_counts().await.unwrap(),
        rows(&[("edited", 1), ("http_call", 0), ("proxy_connect", 0)])
    );
    raw.batch_execute("TRUNCATE audit_log, audit_tip")
        .await
        .unwrap();
    assert_eq!(two.audit_counts().await.unwrap(), rows(&[]));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgraded_database_starts_with_its_rows_counted() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let chain = Arc::new(AuditChain::from_audit_key(&[7; 32]));
    for _ in 0..4 {
        store.audit_append(event(), chain.clone()).await.unwrap();
    }
    // The schema as the build before the counts left it, with four rows in the log.
    session(&db)
        .await
        .batch_execute(
            "DROP TRIGGER audit_row_appended ON audit_log;
             DROP TRIGGER audit_rows_removed ON audit_log;
             DROP TRIGGER audit_rows_changed ON audit_log;
             DROP TRIGGER audit_log_emptied ON audit_log;
             DROP FUNCTION runwarden_audit_row_appended, runwarden_audit_rows_removed,
                 runwarden_audit_rows_changed, runwarden_audit_log_emptied;
             DROP TABLE audit_counts;
             DELETE FROM schema_migrations WHERE version = 23;",
        )
        .await
        .unwrap();
    let upgraded = db.node().await;
    assert_eq!(
        upgraded.audit_counts().await.unwrap(),
        rows(&[("http_call", 4)])
    );
    upgraded.audit_append(event(), chain).await.unwrap();
    assert_eq!(
        upgraded.audit_counts().await.unwrap(),
        rows(&[("http_call", 5)])
    );
}
