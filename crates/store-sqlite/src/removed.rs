//! The database file, its write-ahead log or its shared-memory index deleted under a
//! running process (an operator's `rm`, a cleanup job). SQLite goes on writing to the
//! files it has open, which no other process will ever read: every change from then on
//! would be lost at the next start, and a run whose claim or fence mark is lost could be
//! executed again.
//!
//! [`Watched`] remembers which files (by inode) the store opened and compares them with
//! what the paths name now, before every call on the write connection. The first time a
//! file is found gone, what the deleted log holds is copied into the database file (a
//! checkpoint through the connection that still has it open), one ERROR says which file
//! disappeared and what to do (the database file itself has nothing to copy into: it says
//! to restore from a backup), and from then on every write of this process is refused,
//! so it claims nothing and `/readyz` fails, until it is restarted.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use runwarden_vault::store::{StoreError, StoreFault};
use rusqlite::Connection;

/// The database file and its `-wal` and `-shm` files as the store opened them.
pub(crate) struct Watched {
    files: Vec<(PathBuf, u64)>,
    /// The database file itself: when it is the one gone, nothing can be saved into it.
    database: PathBuf,
    /// Set (for good) the first time a file was found gone.
    gone: AtomicBool,
}

impl Watched {
    /// The files' inodes now, just after opening; a file that does not exist yet is not
    /// watched. `database` is the database file, one of `files`.
    pub(crate) fn now(database: &Path, files: &[PathBuf]) -> Self {
        let files = files
            .iter()
            .filter_map(|path| Some((path.clone(), std::fs::metadata(path).ok()?.ino())))
            .collect();
        Self {
            files,
            database: database.to_path_buf(),
            gone: AtomicBool::new(false),
        }
    }

    /// The first watched file that no longer is what its path names.
    fn missing(&self) -> Option<&Path> {
        self.files
            .iter()
            .find(|(path, ino)| std::fs::metadata(path).map(|m| m.ino()).ok() != Some(*ino))
            .map(|(path, _)| path.as_path())
    }

    /// Refuses the call when a watched file is gone; the first time, saves what the
    /// connection still holds and says so once at ERROR.
    pub(crate) fn check(&self, conn: &Connection, operation: &str) -> Result<(), StoreError> {
        let Some(path) = self.missing() else {
            return Ok(());
        };
        let refused = |saved: &str| {
            StoreError::with_fault(
                operation,
                StoreFault::Corrupt,
                format!(
                    "{} was deleted while this process had it open; {saved}: stop this process \
                     and start it again (its runs go back to the queue)",
                    path.display()
                ),
            )
        };
        if self.gone.swap(true, Ordering::SeqCst) {
            return Err(refused("this process writes nothing more"));
        }
        let saved = if path == self.database {
            // Its data went with it: a checkpoint would only write into the deleted file.
            "what it held is gone with it: restore it from a backup".to_string()
        } else {
            match checkpoint(conn) {
                Ok(()) => "the changes it held were copied into the database file".to_string(),
                Err(e) => format!(
                    "the changes written since the last checkpoint may be lost (copying them into \
                 the database file failed: {e})"
                ),
            }
        };
        let error = refused(&saved);
        tracing::error!(
            file = %path.display(),
            "a database file was deleted under this process: {}; no new run is claimed and \
             /readyz fails until the process is restarted",
            error.message
        );
        Err(error)
    }
}

/// Copies every committed frame of the (deleted, still open) log into the database file.
fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    let (busy, _, _): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    if busy != 0 {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("another connection kept the checkpoint from completing".into()),
        ));
    }
    Ok(())
}
