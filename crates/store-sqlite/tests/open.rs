//! Opening: pragmas for sharing one file (SPEC O3), the `init` hint, and schema versions.

use runwarden_store_sqlite::SqliteStore;

use crate::common::TempDb;

#[test]
fn open_existing_on_a_missing_file_says_to_run_init() {
    let db = TempDb::new();
    let error = SqliteStore::open_existing(&db.path).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!("no database at {}", db.path.display())),
        "{text}"
    );
    assert!(text.contains("run `runwarden init`"), "{text}");
    assert!(!db.path.exists(), "open_existing never creates the file");
}

#[test]
fn open_creates_the_file_in_wal_mode() {
    let db = TempDb::new();
    let store = db.open();
    assert_eq!(store.path(), db.path);
    let mode: String = db
        .raw()
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn reopening_applies_no_migration_twice() {
    let db = TempDb::new();
    drop(db.open());
    drop(db.open());
    let versions: Vec<i64> = {
        let conn = db.raw();
        let mut stmt = conn
            .prepare("SELECT version FROM schema_migrations ORDER BY version")
            .unwrap();
        stmt.query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(versions, [1, 2, 3, 4, 5]);
}

#[test]
fn a_database_from_a_newer_runwarden_is_refused() {
    let db = TempDb::new();
    drop(db.open());
    db.raw().execute("INSERT INTO schema_migrations (version, name, applied_ms) VALUES (9999, '9999_future', 0)", []).unwrap();
    for error in [
        SqliteStore::open(&db.path).unwrap_err(),
        SqliteStore::open_existing(&db.path).unwrap_err(),
    ] {
        let text = error.to_string();
        assert!(
            text.contains("database was written by a newer runwarden"),
            "{text}"
        );
        assert!(text.contains("schema version 9999"), "{text}");
    }
}
