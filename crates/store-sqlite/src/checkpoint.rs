//! When the write connection checkpoints: its WAL hook, in place of SQLite's automatic
//! checkpoint. A commit made on a runtime thread (`quick_write`) leaves the checkpoint to
//! the blocking pool, since it syncs the database file and may take milliseconds.

use std::cell::Cell;
use std::os::raw::c_int;

use rusqlite::hooks::Wal;

/// The WAL's size, in pages, from which a commit is followed by a checkpoint: SQLite's own
/// default (`wal_autocheckpoint`), which the hook below replaces on the write connection.
pub(crate) const CHECKPOINT_PAGES: c_int = 1000;

/// The WAL's size from which a quick write checkpoints where it is after all: the
/// checkpoint it left to the pool has not run (a runtime with one thread, busy with quick
/// writes that never yield), and the WAL must not grow without bound.
const BACKSTOP_PAGES: c_int = 4 * CHECKPOINT_PAGES;

thread_local! {
    /// `Some` while a quick write commits on this thread: the WAL hook then records the
    /// WAL's size here instead of checkpointing.
    static DEFERRED: Cell<Option<c_int>> = const { Cell::new(None) };
}

/// The write connection's WAL hook, called after each commit with the WAL's size in pages.
/// On the pool it checkpoints as SQLite's automatic checkpoint does (a passive checkpoint
/// from 1,000 pages on); during a quick write it records the size, and checkpoints only
/// from [`BACKSTOP_PAGES`] on. It never fails the commit, which has happened: a checkpoint
/// that fails leaves the WAL as it was, and the next commit tries again.
pub(crate) fn after_commit(wal: &Wal, pages: c_int) -> rusqlite::Result<()> {
    let deferred = DEFERRED.with(|d| d.get().map(|_| d.set(Some(pages))).is_some());
    let due = if deferred {
        BACKSTOP_PAGES
    } else {
        CHECKPOINT_PAGES
    };
    if pages >= due {
        let _ = wal.checkpoint();
    }
    Ok(())
}

/// Runs `commit` with the hook's checkpoint deferred on this thread; returns what it
/// returned and the WAL's size in pages after its last commit (0 if none).
pub(crate) fn deferring<R>(commit: impl FnOnce() -> R) -> (R, c_int) {
    DEFERRED.set(Some(0));
    let done = commit();
    (done, DEFERRED.replace(None).unwrap_or(0))
}
