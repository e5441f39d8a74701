//! A tiny migration runner: numbered SQL files embedded at build time, applied in order.

use runwarden_vault::store::StoreError;
use rusqlite::{Connection, TransactionBehavior};

use crate::failure::{Failure, classify};

/// One embedded migration, named like its file `NNNN_description.sql`.
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

/// Every migration this build knows, oldest first. Adding one is adding one line; a
/// released file is never edited.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_vault",
        sql: include_str!("../migrations/0001_vault.sql"),
    },
    Migration {
        version: 2,
        name: "0002_mcp",
        sql: include_str!("../migrations/0002_mcp.sql"),
    },
    Migration {
        version: 3,
        name: "0003_runs",
        sql: include_str!("../migrations/0003_runs.sql"),
    },
    Migration {
        version: 4,
        name: "0004_queue",
        sql: include_str!("../migrations/0004_queue.sql"),
    },
    Migration {
        version: 5,
        name: "0005_tokens",
        sql: include_str!("../migrations/0005_tokens.sql"),
    },
    Migration {
        version: 6,
        name: "0006_audit_intent",
        sql: include_str!("../migrations/0006_audit_intent.sql"),
    },
    Migration {
        version: 7,
        name: "0007_notify",
        sql: include_str!("../migrations/0007_notify.sql"),
    },
    Migration {
        version: 8,
        name: "0008_decisions",
        sql: include_str!("../migrations/0008_decisions.sql"),
    },
    Migration {
        version: 9,
        name: "0009_catalogue_output_schema",
        sql: include_str!("../migrations/0009_catalogue_output_schema.sql"),
    },
    Migration {
        version: 10,
        name: "0010_console_sessions",
        sql: include_str!("../migrations/0010_console_sessions.sql"),
    },
    Migration {
        version: 11,
        name: "0011_keys_and_workers",
        sql: include_str!("../migrations/0011_keys_and_workers.sql"),
    },
    Migration {
        version: 12,
        name: "0012_oauth_refresh_lease",
        sql: include_str!("../migrations/0012_oauth_refresh_lease.sql"),
    },
    Migration {
        version: 13,
        name: "0013_decision_reissue",
        sql: include_str!("../migrations/0013_decision_reissue.sql"),
    },
    Migration {
        version: 14,
        name: "0014_claim_epoch",
        sql: include_str!("../migrations/0014_claim_epoch.sql"),
    },
    Migration {
        version: 15,
        name: "0015_mcp_protocol",
        sql: include_str!("../migrations/0015_mcp_protocol.sql"),
    },
    Migration {
        version: 16,
        name: "0016_secrets_version",
        sql: include_str!("../migrations/0016_secrets_version.sql"),
    },
];

/// Brings the schema up to date. The version is read first, without a lock a reader
/// would not take: a database already at this build's version is never write-locked, so
/// `status`, `events`, `audit list` and the other read commands work while another process
/// holds the write lock. Only a schema that is behind takes one immediate transaction
/// (re-reading the version under it), so two processes opening the same new file at once
/// apply each migration exactly once.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), Failure> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    if let Some(applied) = applied_version(conn)? {
        refuse_newer(applied, known)?;
        if applied == known {
            return Ok(());
        }
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
    refuse_newer(applied, known)?;
    for migration in MIGRATIONS.iter().filter(|m| m.version > applied) {
        tx.execute_batch(migration.sql).map_err(|e| {
            StoreError::with_fault(
                "migrating the database",
                classify(&e),
                format!("migration {} failed: {e}", migration.name),
            )
        })?;
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

/// A database written by a newer build is refused rather than misread.
fn refuse_newer(applied: i64, known: i64) -> Result<(), Failure> {
    if applied > known {
        return Err(StoreError::new(
            "migrating the database",
            format!(
                "database was written by a newer runwarden (schema version {applied}, this build knows up to {known}): \
                 upgrade runwarden to use it"
            ),
        )
        .into());
    }
    Ok(())
}

/// The latest schema version this build knows.
#[cfg(test)]
fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_upwards_from_one_and_named_by_their_number() {
        // Numbers are assigned per piece of work ahead of time, so a branch may skip the
        // numbers of work merged elsewhere; they only ever go up.
        let mut previous = 0;
        for migration in MIGRATIONS {
            let expected = migration.version;
            assert!(expected > previous, "{} is out of order", migration.name);
            previous = expected;
            assert!(
                migration.name.starts_with(&format!("{expected:04}_")),
                "{}",
                migration.name
            );
        }
        assert_eq!(latest_version(), previous);
    }

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
