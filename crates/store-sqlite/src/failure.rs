//! The store's internal failure type, turned into a `StoreError` at the blocking boundary,
//! and the classification of SQLite's faults into [`StoreFault`]s whose messages say what
//! to do.

use runwarden_vault::store::{StoreError, StoreFault};
use rusqlite::ErrorCode;

/// Why a blocking store call failed, before the operation name is attached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// SQLite refused or failed the statement.
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    /// A stored value cannot be what this build wrote.
    #[error("{0}: the database is corrupt, restore it from a backup")]
    Corrupt(String),
    /// An error that already names its operation (from a rewrap closure or the migrator).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Failure {
    /// Attaches the operation, passing an existing `StoreError` through unchanged, and
    /// names the fault of a SQLite error.
    pub(crate) fn into_store_error(self, operation: &str) -> StoreError {
        match self {
            Self::Store(error) => error,
            Self::Corrupt(problem) => StoreError::with_fault(
                operation,
                StoreFault::Corrupt,
                format!("{problem}: the database is corrupt, restore it from a backup"),
            ),
            Self::Sql(error) => {
                let fault = classify(&error);
                StoreError::with_fault(operation, fault, described(&error, fault))
            }
        }
    }
}

/// The fault behind a SQLite error. SQLite does not hand out the `errno` behind
/// `CANTOPEN`, so a failed open is checked against the process's descriptor table: when
/// even `/dev/null` cannot be opened, the process is out of file descriptors.
pub(crate) fn classify(error: &rusqlite::Error) -> StoreFault {
    let Some(code) = error.sqlite_error_code() else {
        return StoreFault::Other;
    };
    match code {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreFault::Busy,
        ErrorCode::ReadOnly => StoreFault::ReadOnly,
        ErrorCode::DiskFull => StoreFault::DiskFull,
        ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => StoreFault::Corrupt,
        ErrorCode::CannotOpen if out_of_descriptors() => StoreFault::TooManyFiles,
        ErrorCode::CannotOpen | ErrorCode::PermissionDenied => StoreFault::ReadOnly,
        ErrorCode::SystemIoFailure | ErrorCode::FileLockingProtocolFailed => {
            if out_of_descriptors() {
                StoreFault::TooManyFiles
            } else {
                StoreFault::Io
            }
        }
        _ => StoreFault::Other,
    }
}

/// SQLite's own words followed by what the operator can do about this kind of fault.
fn described(error: &rusqlite::Error, fault: StoreFault) -> String {
    let advice = match fault {
        StoreFault::Busy => {
            "another process holds the write lock (a long transaction, a stuck process or a \
             backup); retry once it ends, and find it with `fuser` on the database file"
        }
        StoreFault::ReadOnly => {
            "the database cannot be written or its directory cannot be entered: check the \
             file's and the directory's permissions and owner (the -wal and -shm files beside \
             it too) and that the file system is not mounted read-only"
        }
        StoreFault::DiskFull => {
            "the disk holding the database is full: free space (or raise the quota), then retry"
        }
        StoreFault::TooManyFiles => {
            "the process ran out of file descriptors: raise its open-file limit (ulimit -n) \
             or lower [serve] max_connections, then retry"
        }
        StoreFault::Io => {
            "reading or writing the database file failed: check the disk and the file system \
             (dmesg), then retry"
        }
        StoreFault::Corrupt => {
            "the database file is damaged or is not a runwarden database: restore it from a \
             backup"
        }
        _ => return error.to_string(),
    };
    format!("{error}: {advice}")
}

/// True when this process cannot open one more file (`EMFILE`, or `ENFILE` for the whole
/// system). Opening `/dev/null` costs one descriptor for a moment.
fn out_of_descriptors() -> bool {
    match std::fs::File::open("/dev/null") {
        Ok(_) => false,
        Err(error) => is_out_of_files(&error),
    }
}

/// True for "too many open files", per process or per system.
pub(crate) fn is_out_of_files(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(code) if code == EMFILE || code == ENFILE)
}

/// `errno` values of "too many open files" (per process and per system) on Linux and the
/// BSDs alike.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// Reads a 32-byte hash column, refusing any other length rather than panicking.
pub(crate) fn hash32(bytes: Vec<u8>, what: &str) -> Result<[u8; 32], Failure> {
    let len = bytes.len();
    bytes
        .try_into()
        .map_err(|_| Failure::Corrupt(format!("{what} holds {len} bytes instead of 32")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scratch.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x INTEGER);")
            .unwrap();
        (dir, path)
    }

    #[test]
    fn a_write_while_another_connection_holds_an_exclusive_lock_is_busy_and_retryable() {
        let (_dir, path) = scratch();
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let writer = Connection::open(&path).unwrap();
        writer.busy_timeout(std::time::Duration::ZERO).unwrap();
        let error = writer.execute("INSERT INTO t VALUES (1)", []).unwrap_err();
        let error = Failure::from(error).into_store_error("inserting a row");
        assert_eq!(error.fault, StoreFault::Busy);
        assert!(error.is_retryable());
        assert!(
            error
                .message
                .contains("another process holds the write lock"),
            "{error}"
        );
    }

    #[test]
    fn a_write_to_a_read_only_database_is_read_only_and_says_to_check_permissions() {
        let (_dir, path) = scratch();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY;
        let reader = Connection::open_with_flags(&path, flags).unwrap();
        let error = reader.execute("INSERT INTO t VALUES (1)", []).unwrap_err();
        let error = Failure::from(error).into_store_error("inserting a row");
        assert_eq!(error.fault, StoreFault::ReadOnly);
        assert!(
            error
                .message
                .contains("check the file's and the directory's permissions"),
            "{error}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_database_is_corrupt_and_not_retryable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("garbage.db");
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        let conn = Connection::open(&path).unwrap();
        let error = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_err();
        let error = Failure::from(error).into_store_error("counting tables");
        assert_eq!(error.fault, StoreFault::Corrupt);
        assert!(!error.is_retryable());
        assert!(
            error.message.contains("restore it from a backup"),
            "{error}"
        );
    }

    #[test]
    fn a_constraint_violation_is_neither_retryable_nor_unavailable() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE u (x INTEGER PRIMARY KEY); INSERT INTO u VALUES (1);")
            .unwrap();
        let error = conn.execute("INSERT INTO u VALUES (1)", []).unwrap_err();
        let error = Failure::from(error).into_store_error("inserting a row");
        assert_eq!(error.fault, StoreFault::Other);
        assert!(!error.is_retryable() && !error.is_unavailable());
    }

    #[test]
    fn a_stored_value_of_the_wrong_shape_is_corrupt() {
        let error = hash32(vec![1, 2, 3], "the tip hash")
            .unwrap_err()
            .into_store_error("reading the tip");
        assert_eq!(error.fault, StoreFault::Corrupt);
        assert!(error.message.contains("holds 3 bytes"), "{error}");
    }
}
