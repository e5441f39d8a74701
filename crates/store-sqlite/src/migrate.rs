//! A tiny migration runner: the shared list of numbered migrations, its SQL files embedded
//! at build time, applied in order.

use runwarden_base::StoreError;
use runwarden_runtime::migrations::{self, MIGRATIONS, Migration};
use rusqlite::{Connection, TransactionBehavior};

use crate::failure::{Failure, classify};

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

/// Brings the schema up to date. The version is read first, without a lock a reader
/// would not take: a database already at this build's version is never write-locked, so
/// `status`, `events`, `audit list` and the other read commands work while another process
/// holds the write lock. Only a schema that is behind takes one immediate transaction
/// (re-reading the version under it), so two processes opening the same new file at once
/// apply each migration exactly once.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), Failure> {
    if let Some(applied) = applied_version(conn)?
        && pending(applied)?.next().is_none()
    {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             name       TEXT    NOT NULL,
             applied_ms INTEGER NOT NULL
         )",
    )?;
    let applied: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?;
    for (migration, sql) in pending(applied)? {
        tx.execute_batch(sql)
            .map_err(|e| migrations::failed(migration, classify(&e), &e))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_ms) VALUES (?1, ?2, ?3)",
            (migration.version, migration.name, now_ms()),
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// The schema version recorded in the file, read without a write lock; `None` for a file
/// that has never been migrated.
fn applied_version(conn: &Connection) -> Result<Option<i64>, Failure> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations')",
        [],
        |row| row.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    let applied = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?;
    Ok(Some(applied))
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

use runwarden_base::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_applies_each_migration_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, i64::try_from(MIGRATIONS.len()).unwrap());
    }
}
