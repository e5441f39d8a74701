//! The one list of schema migrations every store backend applies, and the runner's
//! bookkeeping rules: which migrations a schema still needs, and that a schema written by
//! a newer build is refused rather than misread.
//!
//! The SQL text stays in each backend (`crates/store-*/migrations/NNNN_description.sql`,
//! the same numbers and names everywhere, embedded at build time); each backend checks at
//! compile time, with [`same_names`], that its texts follow this list.

use runwarden_vault::store::{StoreError, StoreFault};

/// One migration: its number and its name (the file name without `.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The schema version it brings the database to.
    pub version: i64,
    /// `NNNN_description`, `NNNN` being the version.
    pub name: &'static str,
}

impl Migration {
    const fn new(version: i64, name: &'static str) -> Self {
        Self { version, name }
    }
}

/// Every migration this build knows, oldest first. Adding one is adding one line here and
/// the same-named file in every backend; a released migration is never edited.
pub const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "0001_vault"),
    Migration::new(2, "0002_mcp"),
    Migration::new(3, "0003_runs"),
    Migration::new(4, "0004_queue"),
    Migration::new(5, "0005_tokens"),
    Migration::new(6, "0006_audit_intent"),
    Migration::new(7, "0007_notify"),
    Migration::new(8, "0008_decisions"),
    Migration::new(9, "0009_catalogue_output_schema"),
    Migration::new(10, "0010_console_sessions"),
    Migration::new(11, "0011_keys_and_workers"),
    Migration::new(12, "0012_oauth_refresh_lease"),
    Migration::new(13, "0013_decision_reissue"),
    Migration::new(14, "0014_claim_epoch"),
    Migration::new(15, "0015_mcp_protocol"),
    Migration::new(16, "0016_secrets_version"),
    Migration::new(17, "0017_run_origin"),
    Migration::new(18, "0018_limits"),
    Migration::new(19, "0019_decisions_in_call"),
    Migration::new(20, "0020_claim_order"),
    Migration::new(21, "0021_catalogue_version"),
    Migration::new(22, "0022_list_indexes"),
    Migration::new(23, "0023_audit_counts"),
    Migration::new(24, "0024_run_counts"),
];

/// The latest schema version this build knows.
pub const LATEST: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// What the runner does on a schema at version `applied` (0 for a new database): the
/// migrations still to apply, oldest first, or an error when a newer build wrote it.
pub fn pending(applied: i64) -> Result<&'static [Migration], StoreError> {
    if applied > LATEST {
        return Err(StoreError::new(
            MIGRATING,
            format!(
                "database was written by a newer runwarden (schema version {applied}, this build knows up to {LATEST}): \
                 upgrade runwarden to use it"
            ),
        ));
    }
    let done = MIGRATIONS.partition_point(|m| m.version <= applied);
    Ok(&MIGRATIONS[done..])
}

/// The error of a migration whose SQL failed, with the fault the backend found.
pub fn failed(
    migration: &Migration,
    fault: StoreFault,
    error: impl std::fmt::Display,
) -> StoreError {
    StoreError::with_fault(
        MIGRATING,
        fault,
        format!("migration {} failed: {error}", migration.name),
    )
}

const MIGRATING: &str = "migrating the database";

/// Whether a backend's SQL texts, as `(name, sql)` pairs, follow [`MIGRATIONS`] one for
/// one, in order. A `const` so a backend asserts it at compile time.
pub const fn same_names(texts: &[(&str, &str)]) -> bool {
    if texts.len() != MIGRATIONS.len() {
        return false;
    }
    let mut i = 0;
    while i < texts.len() {
        let (a, b) = (texts[i].0.as_bytes(), MIGRATIONS[i].name.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut j = 0;
        while j < a.len() {
            if a[j] != b[j] {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
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
            assert!(
                migration.version > previous,
                "{} is out of order",
                migration.name
            );
            previous = migration.version;
            assert!(
                migration.name.starts_with(&format!("{previous:04}_")),
                "{}",
                migration.name
            );
        }
        assert_eq!(LATEST, previous);
    }

    #[test]
    fn a_new_database_needs_every_migration_and_a_current_one_none() {
        assert_eq!(pending(0).unwrap(), MIGRATIONS);
        assert!(pending(LATEST).unwrap().is_empty());
        let after_first = pending(MIGRATIONS[0].version).unwrap();
        assert_eq!(after_first, &MIGRATIONS[1..]);
    }

    #[test]
    fn a_schema_from_a_newer_build_is_refused_with_what_to_do() {
        let error = pending(LATEST + 1).unwrap_err().to_string();
        assert!(error.contains("newer runwarden"), "{error}");
        assert!(error.contains("upgrade runwarden"), "{error}");
    }

    #[test]
    fn a_backend_list_must_follow_the_shared_one_in_order() {
        let texts: Vec<(&str, &str)> = MIGRATIONS.iter().map(|m| (m.name, "")).collect();
        assert!(same_names(&texts));
        let mut swapped = texts.clone();
        swapped.swap(0, 1);
        assert!(!same_names(&swapped));
        assert!(!same_names(&texts[1..]));
        let mut renamed = texts;
        renamed[2].0 = "0003_rns";
        assert!(!same_names(&renamed));
    }
}
