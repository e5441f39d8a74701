//! The secrets' version across nodes: a vault on one node sees a secret put through
//! another at once, and reading the version never waits for a transaction that is changing
//! the secrets.

use std::time::{Duration, Instant};

use runwarden_vault::store::VaultStore;

use crate::common::TestDb;

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_put_on_another_node_is_searched_for_at_once() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_secret_freshness(db.node().await, db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_version_is_read_while_another_session_changes_a_secret() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let before = store.sealed_secrets_version().await.unwrap();
    // Another session puts a secret and holds its transaction open: the version row is
    // locked by it until it commits.
    let (mut other, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO sealed VALUES ('secret', 'pending', 'xchacha20poly1305', 1, 'mk-1', '\\x01', '\\x02', '\\x03', '\\x04', 1, 1)",
        &[],
    )
    .await
    .unwrap();
    let started = Instant::now();
    let during = store.sealed_secrets_version().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "the version read waited {took:?} behind the open transaction"
    );
    assert_eq!(during, before, "an uncommitted put is not seen");
    tx.commit().await.unwrap();
    assert_ne!(
        store.sealed_secrets_version().await.unwrap(),
        before,
        "the other session's committed put is seen by the next read"
    );
}
