//! The conformance suites every store backend runs, unchanged, on a fresh database each.

use crate::common::TestDb;

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_vault_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_vault_store(db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_token_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_token_store(db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_catalogue_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_catalogue_store(db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_run_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_run_store(db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_decision_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_decision_store(db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_queue_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_queue_store(db.node().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_passes_the_session_suite() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_session_store(db.node().await).await;
}
