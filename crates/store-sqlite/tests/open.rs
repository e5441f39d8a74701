//! Opening: pragmas for sharing one file (O3), the `init` hint, and schema versions.

use runwarden_runtime::migrations::MIGRATIONS;
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
    let listed: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(versions, listed);
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

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
fn sibling(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

#[cfg(unix)]
#[test]
fn a_new_database_and_its_wal_and_shm_files_are_private_to_the_owner() {
    let db = TempDb::new();
    let store = db.open();
    for file in [
        db.path.clone(),
        sibling(&db.path, "-wal"),
        sibling(&db.path, "-shm"),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert!(store.tightened().is_empty(), "{:?}", store.tightened());
}

#[cfg(unix)]
#[test]
fn an_existing_database_readable_by_others_is_tightened_at_open_and_reported() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = TempDb::new();
    drop(db.open());
    std::fs::set_permissions(&db.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = SqliteStore::open_existing(&db.path).unwrap();
    assert_eq!(mode(&db.path), 0o600);
    let notes = store.tightened().join("\n");
    assert!(
        notes.contains("was mode 0644, readable by other users: tightened it to 0600"),
        "{notes}"
    );
    assert_eq!(mode(&sibling(&db.path, "-wal")), 0o600);
}

#[test]
fn opening_an_up_to_date_database_takes_no_write_lock() {
    let db = TempDb::new();
    drop(db.open());
    let holder = db.raw();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    // The busy timeout is five seconds: an open that needed the write lock would fail.
    let started = std::time::Instant::now();
    let store = SqliteStore::open_existing(&db.path).unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(store);
    holder.execute_batch("ROLLBACK").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_while_another_process_holds_the_write_lock_is_a_retryable_busy_fault() {
    use runwarden_base::StoreFault;
    use runwarden_runtime::RunStore;
    let db = TempDb::new();
    let store = db.open();
    let holder = db.raw();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let error = store
        .run_cancel("some-run", 1)
        .await
        .expect_err("the write lock is held elsewhere");
    assert_eq!(error.fault, StoreFault::Busy, "{error}");
    assert!(error.is_retryable());
    assert!(
        error
            .message
            .contains("another process holds the write lock"),
        "{error}"
    );
    // Reads still answer (WAL): only writers wait for the lock.
    assert!(store.run_get("some-run").await.unwrap().is_none());
    holder.execute_batch("ROLLBACK").unwrap();
}
