//! Limits (R14) on PostgreSQL: two nodes on one database share them.

use crate::common::TestDb;

#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_on_one_database_share_every_limit() {
    let db = TestDb::new().await;
    runwarden_storetest::exercise_limit_store(db.node().await, db.node().await).await;
}
