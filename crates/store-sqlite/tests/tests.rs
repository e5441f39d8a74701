//! The store-sqlite integration tests: the conformance suite on a real file, plus what only
//! a real file can show (tampering through raw SQL, several connections, migrations).

mod audit_counts;
mod audit_tamper;
mod catalogue;
mod common;
mod concurrency;
mod limits;
mod open;
mod other_writers;
mod queue;
mod quick_write;
mod run_counts;
mod runs;
mod sealed;
mod secrets_version;

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_conformance_suite() {
    let db = common::TempDb::new();
    runwarden_storetest::exercise_vault_store(std::sync::Arc::new(db.open())).await;
}
