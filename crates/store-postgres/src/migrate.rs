//! The migration runner: numbered SQL files embedded at build time, with the same numbers
//! and names as SQLite's, applied in one transaction under an advisory lock.

use deadpool_postgres::Object;
use runwarden_vault::store::StoreError;

use crate::failure::{Failure, classify, finish};

/// One embedded migration, named like its file `NNNN_description.sql`.
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

/// Every migration this build knows, oldest first. Adding one is adding one line (and the
/// same-numbered file in every backend); a released file is never edited.
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

/// The advisory lock key that serialises migrations across nodes ("rwmigrat" in ASCII).
const MIGRATION_LOCK: i64 = 0x7277_6d69_6772_6174;

/// Brings the schema up to date. Nodes starting together each take the transaction-scoped
/// advisory lock first, so one applies the pending migrations and the others, once it
/// commits, find nothing left to do. PostgreSQL's DDL is transactional: a failed migration
/// leaves the schema as it was.
pub(crate) async fn migrate(client: &mut Object) -> Result<(), Failure> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
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
        refuse_newer(applied, known)?;
        for migration in MIGRATIONS.iter().filter(|m| m.version > applied) {
            tx.batch_execute(migration.sql).await.map_err(|e| {
                StoreError::with_fault(
                    "migrating the database",
                    classify(&e),
                    format!("migration {} failed: {e}", migration.name),
                )
            })?;
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

pub(crate) fn now_ms() -> i64 {
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
    }

    #[test]
    fn every_migration_has_a_same_named_sqlite_twin() {
        let sqlite =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../store-sqlite/migrations");
        for migration in MIGRATIONS {
            let twin = sqlite.join(format!("{}.sql", migration.name));
            assert!(twin.is_file(), "no SQLite twin for {}", migration.name);
        }
        let count = std::fs::read_dir(&sqlite).unwrap().count();
        assert_eq!(
            count,
            MIGRATIONS.len(),
            "the backends' migration lists differ"
        );
    }
}
