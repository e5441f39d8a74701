//! Helpers shared by the integration tests: a server, a fresh database, a store on it.

use std::sync::Arc;

use runwarden_store_postgres::PgStore;
use runwarden_testkit::TempCluster;

/// A server (this test's own, or the shared one) and a fresh database on it.
pub(crate) struct TestDb {
    /// Kept alive for as long as the test runs; dropping it stops an owned cluster.
    pub(crate) cluster: TempCluster,
    pub(crate) url: String,
}

impl TestDb {
    pub(crate) async fn new() -> Self {
        Self::on(TempCluster::start()).await
    }

    pub(crate) async fn on(cluster: TempCluster) -> Self {
        let url = cluster.fresh_database().await;
        Self { cluster, url }
    }

    /// A plain session on this database, around the store's code (an older node, a hand
    /// edit).
    pub(crate) async fn session(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    }

    /// Puts the schema back to `version`, as a build before the later migrations left it,
    /// keeping the rows of the tables it had. Each migration a test undoes is listed here.
    pub(crate) async fn schema_back_to(&self, version: i64) {
        let undo = [
            (
                23,
                "DROP TRIGGER audit_rows_removed ON audit_log;
                 DROP TRIGGER audit_rows_changed ON audit_log;
                 DROP TRIGGER audit_log_emptied ON audit_log;
                 DROP FUNCTION runwarden_audit_rows_removed, runwarden_audit_rows_changed,
                     runwarden_audit_log_emptied;
                 DROP TABLE audit_counts, audit_counted;",
            ),
            (
                24,
                "DROP TRIGGER run_state_changed ON runs;
                 DROP TRIGGER run_inserted_ended ON runs;
                 DROP TRIGGER runs_removed ON runs;
                 DROP TRIGGER runs_emptied ON runs;
                 DROP FUNCTION runwarden_run_state_changed, runwarden_runs_removed,
                     runwarden_runs_emptied;
                 DROP TABLE run_counts, run_count_changes;",
            ),
        ];
        let session = self.session().await;
        for (_, sql) in undo.iter().rev().filter(|(v, _)| *v > version) {
            session.batch_execute(sql).await.unwrap();
        }
        session
            .execute(
                "DELETE FROM schema_migrations WHERE version > $1",
                &[&version],
            )
            .await
            .unwrap();
    }

    /// One more store on this database: one more node.
    pub(crate) async fn node(&self) -> Arc<PgStore> {
        Arc::new(
            PgStore::connect(&self.url)
                .await
                .expect("connecting a node"),
        )
    }
}

pub(crate) use runwarden_base::now_ms;

/// Waits (up to 10 s) until `count_query` answers a count in `want`. The server keeps its
/// view of its sessions for a whole transaction, and the client may be inside one: the
/// view is dropped before each read.
pub(crate) async fn until(
    client: &tokio_postgres::Client,
    count_query: &str,
    want: impl std::ops::RangeBounds<i64>,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        client
            .execute("SELECT pg_stat_clear_snapshot()", &[])
            .await
            .unwrap();
        let n: i64 = client.query_one(count_query, &[]).await.unwrap().get(0);
        if want.contains(&n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{count_query} stayed at {n}"
        );
        tokio::task::yield_now().await;
    }
}

/// One audit event of an answered call, for tests that append rows.
pub(crate) fn audit_event() -> runwarden_vault::audit::AuditEvent {
    runwarden_vault::audit::AuditEvent {
        time_ms: 1,
        action: runwarden_vault::audit::action::HTTP_CALL.into(),
        success: true,
        secret: None,
        method: "GET".into(),
        host: "example.com".into(),
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
