//! The migration runner: numbered SQL files embedded at build time, with the same numbers
//! and names as SQLite's, applied in one transaction under an advisory lock.

use deadpool_postgres::Object;
use runwarden_base::StoreError;
use runwarden_runtime::migrations::{self, MIGRATIONS, Migration};

use crate::failure::{Failure, classify, finish};

/// The SQL of every migration, in the order of the shared list (the runtime's
/// [`MIGRATIONS`]), which this build checks at compile time. A released file is never
/// edited.
const SQL: &[(&str, &str)] = &[
    ("0001_vault", include_str!("../migrations/0001_vault.sql")),
    ("0002_mcp", include_str!("../migrations/0002_mcp.sql")),
    ("0003_runs", include_str!("../migrations/0003_runs.sql")),
    ("0004_queue", include_str!("../migrations/0004_queue.sql")),
    ("0005_tokens", include_str!("../migrations/0005_tokens.sql")),
    (
        "0006_audit_intent",
        include_str!("../migrations/0006_audit_intent.sql"),
    ),
    ("0007_notify", include_str!("../migrations/0007_notify.sql")),
    (
        "0008_decisions",
        include_str!("../migrations/0008_decisions.sql"),
    ),
    (
        "0009_catalogue_output_schema",
        include_str!("../migrations/0009_catalogue_output_schema.sql"),
    ),
    (
        "0010_console_sessions",
        include_str!("../migrations/0010_console_sessions.sql"),
    ),
    (
        "0011_keys_and_workers",
        include_str!("../migrations/0011_keys_and_workers.sql"),
    ),
    (
        "0012_oauth_refresh_lease",
        include_str!("../migrations/0012_oauth_refresh_lease.sql"),
    ),
    (
        "0013_decision_reissue",
        include_str!("../migrations/0013_decision_reissue.sql"),
    ),
    (
        "0014_claim_epoch",
        include_str!("../migrations/0014_claim_epoch.sql"),
    ),
    (
        "0015_mcp_protocol",
        include_str!("../migrations/0015_mcp_protocol.sql"),
    ),
    (
        "0016_secrets_version",
        include_str!("../migrations/0016_secrets_version.sql"),
    ),
    (
        "0017_run_origin",
        include_str!("../migrations/0017_run_origin.sql"),
    ),
    ("0018_limits", include_str!("../migrations/0018_limits.sql")),
    (
        "0019_decisions_in_call",
        include_str!("../migrations/0019_decisions_in_call.sql"),
    ),
    (
        "0020_claim_order",
        include_str!("../migrations/0020_claim_order.sql"),
    ),
    (
        "0021_catalogue_version",
        include_str!("../migrations/0021_catalogue_version.sql"),
    ),
    (
        "0022_list_indexes",
        include_str!("../migrations/0022_list_indexes.sql"),
    ),
    (
        "0023_audit_counts",
        include_str!("../migrations/0023_audit_counts.sql"),
    ),
    (
        "0024_run_counts",
        include_str!("../migrations/0024_run_counts.sql"),
    ),
];

const _: () = assert!(
    migrations::same_names(SQL),
    "the SQL files must follow the shared migration list"
);

/// The advisory lock key that serialises migrations across nodes ("rwmigrat" in ASCII).
const MIGRATION_LOCK: i64 = 0x7277_6d69_6772_6174;

/// Brings the schema up to date. Nodes starting together each take the transaction-scoped
/// advisory lock first, so one applies the pending migrations and the others, once it
/// commits, find nothing left to do. PostgreSQL's DDL is transactional: a failed migration
/// leaves the schema as it was.
pub(crate) async fn migrate(client: &mut Object) -> Result<(), Failure> {
    let tx = client.transaction().await?;
    let result = async {
        // A migration, and the wait for another node's, may take longer than a store
        // call's statement bound: this transaction alone runs without it.
        tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                 version    BIGINT PRIMARY KEY,
                 name       TEXT   NOT NULL,
                 applied_ms BIGINT NOT NULL
             )",
        )
        .await?;
        let applied: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?
            .get(0);
        for (migration, sql) in pending(applied)? {
            tx.batch_execute(sql)
                .await
                .map_err(|e| migrations::failed(migration, classify(&e), &e))?;
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_ms) VALUES ($1, $2, $3)",
                &[&migration.version, &migration.name, &now_ms()],
            )
            .await?;
        }
        Ok(())
    }
    .await;
    finish(tx, result).await
}

/// The migrations a schema at version `applied` still needs, with their SQL; a schema
/// written by a newer build is refused rather than misread.
fn pending(
    applied: i64,
) -> Result<impl Iterator<Item = (&'static Migration, &'static str)>, StoreError> {
    let pending = migrations::pending(applied)?;
    let texts = &SQL[MIGRATIONS.len() - pending.len()..];
    Ok(pending.iter().zip(texts.iter().map(|(_, sql)| *sql)))
}

pub(crate) use runwarden_base::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_holds_exactly_the_files_of_the_shared_list() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut expected: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{}.sql", m.name))
            .collect();
        expected.sort();
        for backend in ["store-postgres", "store-sqlite"] {
            let mut files: Vec<String> = std::fs::read_dir(crates.join(backend).join("migrations"))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            assert_eq!(
                files, expected,
                "{backend}'s migration files differ from the list"
            );
        }
    }
}
