//! Limits (R14) on one SQLite file: two connections (two processes) share them.

use std::sync::Arc;

use crate::common::TempDb;

#[tokio::test(flavor = "multi_thread")]
async fn two_connections_to_one_file_share_every_limit() {
    let db = TempDb::new();
    runwarden_storetest::exercise_limit_store(Arc::new(db.open()), Arc::new(db.open())).await;
}
