//! Short writes on the caller's thread. An unsynced commit of a row or two takes tens of
//! microseconds; a trip to tokio's blocking pool and back costs about as much again, and a
//! `tools/call` makes one for its outcome row. [`SqliteStore::quick_write`] commits on the
//! caller's thread when that cannot stall it, and otherwise goes to the pool as every other
//! call does.
//!
//! What could stall a runtime thread, and what happens instead:
//!
//! - Another connection's write lock (another process): the transaction begins with a busy
//!   timeout of zero, and a lock that is held sends the write to the pool, where it waits
//!   as usual.
//! - A checkpoint, which SQLite runs in the committing call once the WAL holds 1,000 pages
//!   and which syncs the database file: the write connection's WAL hook
//!   ([`after_commit`](crate::checkpoint::after_commit)) leaves it to the pool when the commit ran here, unless the WAL has grown four times
//!   past that because the pool's checkpoint has not run.
//! - A commit that syncs (an intent under `power_cut`): callers never send one here.

use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::time::Duration;

use runwarden_vault::store::StoreError;
use rusqlite::{ErrorCode, Transaction, TransactionBehavior};

use crate::checkpoint::{CHECKPOINT_PAGES, deferring};
use crate::connection::{SqliteStore, WRITER_BUSY_TIMEOUT};
use crate::failure::Failure;

/// What beginning and committing on the caller's thread came to.
enum Tried<T, F> {
    Committed((T, c_int)),
    Failed(Failure),
    /// Another connection holds the write lock.
    Busy(F),
}

/// What trying to write on the caller's thread came to.
enum Here<T, F> {
    Done(Result<T, StoreError>),
    /// The gate, the connection or the write lock was taken: `work` goes to the pool.
    NotNow(F),
}

impl SqliteStore {
    /// Runs `work` in one `BEGIN IMMEDIATE` transaction on the write connection and commits
    /// it: on the caller's thread when the gate, the connection and the write lock are free
    /// at once, otherwise on the blocking pool as [`run`](Self::run) does. For short writes
    /// whose commit does not sync; `work` runs once either way.
    pub(crate) async fn quick_write<T, F>(
        &self,
        operation: &'static str,
        work: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, Failure> + Send + 'static,
    {
        let work = match self.write_here(operation, work) {
            Here::Done(result) => return result,
            Here::NotNow(work) => work,
        };
        self.run(operation, move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = work(&tx)?;
            tx.commit()?;
            Ok(value)
        })
        .await
    }

    fn write_here<T, F>(&self, operation: &'static str, work: F) -> Here<T, F>
    where
        F: FnOnce(&Transaction<'_>) -> Result<T, Failure>,
    {
        let inner = self.inner();
        let Ok(_permit) = inner.gate.try_acquire() else {
            return Here::NotNow(work);
        };
        let Ok(mut conn) = inner.conn.try_lock() else {
            return Here::NotNow(work);
        };
        tracing::trace!(operation, "store call on the caller's thread");
        if let Err(refused) = inner.watched.check(&conn, operation) {
            return Here::Done(Err(refused));
        }
        let before = conn.total_changes();
        let tried = match conn.busy_timeout(Duration::ZERO) {
            Err(e) => Tried::Failed(Failure::from(e)),
            Ok(()) => match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
                Err(e) if is_busy(&e) => Tried::Busy(work),
                Err(e) => Tried::Failed(Failure::from(e)),
                Ok(tx) => match commit_here(tx, operation, work) {
                    Ok(done) => Tried::Committed(done),
                    Err(e) => Tried::Failed(e),
                },
            },
        };
        let restored = conn.busy_timeout(WRITER_BUSY_TIMEOUT);
        let wrote = conn.total_changes() > before;
        drop(conn);
        let result = match (tried, restored) {
            (Tried::Busy(work), Ok(())) => return Here::NotNow(work),
            (Tried::Busy(_), Err(e)) => Err(Failure::from(e).into_store_error(operation)),
            (Tried::Failed(e), _) => Err(e.into_store_error(operation)),
            (Tried::Committed((value, pages)), restored) => {
                if pages >= CHECKPOINT_PAGES {
                    self.checkpoint_later();
                }
                // Committed: a timeout not put back is the next call's error, not this one's.
                if let Err(e) = restored {
                    tracing::debug!(error = %e, "the write connection's busy timeout was not put back");
                }
                Ok(value)
            }
        };
        runwarden_runtime::observe_store_call(&result, wrote);
        Here::Done(result)
    }

    /// Runs a passive checkpoint on the pool, behind the writes already waiting: the one a
    /// quick write's commit left undone. One at a time.
    fn checkpoint_later(&self) {
        if self.inner().checkpoint_due.swap(true, Ordering::AcqRel) {
            return;
        }
        let due = Due(self.clone());
        tokio::spawn(async move {
            let _ = due
                .0
                .run("checkpointing the database", |conn| {
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::debug!(error = %e, "a checkpoint failed; a later commit tries again");
                    }
                    Ok(())
                })
                .await;
        });
    }
}

/// A checkpoint left to the pool; dropped when it has run, or when its runtime shut down
/// first, so that a later quick write can leave another.
struct Due(SqliteStore);

impl Drop for Due {
    fn drop(&mut self) {
        self.0
            .inner()
            .checkpoint_due
            .store(false, Ordering::Release);
    }
}

/// Runs `work` in `tx` and commits, with the WAL hook's checkpoint deferred; returns the
/// WAL's size after the commit. A panic in `work` rolls back and becomes an error.
fn commit_here<T, F>(
    tx: Transaction<'_>,
    operation: &'static str,
    work: F,
) -> Result<(T, c_int), Failure>
where
    F: FnOnce(&Transaction<'_>) -> Result<T, Failure>,
{
    tx.busy_timeout(WRITER_BUSY_TIMEOUT)?;
    let (done, pages) = deferring(|| {
        catch_unwind(AssertUnwindSafe(|| {
            let value = work(&tx)?;
            tx.commit()?;
            Ok(value)
        }))
    });
    match done {
        Ok(done) => done.map(|value| (value, pages)),
        Err(_) => {
            Err(StoreError::new(operation, "the write panicked: nothing was committed").into())
        }
    }
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _)
            if matches!(e.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::thread::{self, ThreadId};
    use std::time::Duration;

    use crate::SqliteStore;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("runwarden.db")).unwrap();
        (dir, store)
    }

    /// Writes one row to the store's own header (`user_version`) and says on which thread.
    async fn write(store: &SqliteStore, version: i32) -> ThreadId {
        store
            .quick_write("writing in a test", move |tx| {
                tx.pragma_update(None, "user_version", version)?;
                Ok(thread::current().id())
            })
            .await
            .unwrap()
    }

    fn version(store: &SqliteStore) -> i32 {
        let conn = rusqlite::Connection::open(store.path()).unwrap();
        conn.pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap()
    }

    #[tokio::test]
    async fn a_write_commits_on_the_callers_thread_when_the_connection_is_free() {
        let (_dir, store) = store();
        assert_eq!(write(&store, 41).await, thread::current().id());
        assert_eq!(version(&store), 41);
    }

    #[tokio::test]
    async fn a_write_goes_to_the_pool_while_the_connection_is_held_and_commits_once_free() {
        let (_dir, store) = store();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let inner = std::sync::Arc::clone(store.inner());
        let holder = thread::spawn(move || {
            let _conn = inner.conn.lock().unwrap();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        held_rx.recv().unwrap();
        let writing = tokio::spawn({
            let store = store.clone();
            async move { write(&store, 42).await }
        });
        // The test's thread is the runtime's only one: it answers while the write waits.
        tokio::task::yield_now().await;
        assert!(!writing.is_finished());
        release_tx.send(()).unwrap();
        let thread = tokio::time::timeout(Duration::from_secs(30), writing)
            .await
            .expect("the write ended once the connection was free")
            .unwrap();
        holder.join().unwrap();
        assert_ne!(thread, thread::current().id(), "it ran on the pool");
        assert_eq!(version(&store), 42);
    }

    /// The WAL's size in frames as a reader sees it: a passive checkpoint from another
    /// connection reports it (and copies what it can, which changes no size).
    fn wal_frames(store: &SqliteStore) -> i64 {
        let conn = rusqlite::Connection::open(store.path()).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
            .unwrap()
    }

    /// A quick write of a row that takes two pages or more.
    async fn fill(store: &SqliteStore) {
        store
            .quick_write("filling", |tx| {
                tx.execute("INSERT INTO filler VALUES (zeroblob(8000))", [])?;
                Ok(())
            })
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpoint_a_quick_write_leaves_runs_on_the_pool_and_the_wal_starts_over() {
        let (_dir, store) = store();
        store
            .run("making a table", |conn| {
                conn.execute_batch("CREATE TABLE filler (b BLOB)")?;
                Ok(())
            })
            .await
            .unwrap();
        let due = || store.inner().checkpoint_due.load(Ordering::Acquire);
        // The WAL passes 1,000 pages within 600 writes.
        let mut writes = 0;
        while !due() {
            fill(&store).await;
            writes += 1;
            assert!(writes < 600, "no checkpoint was left to the pool");
        }
        let waited = std::time::Instant::now();
        while due() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the pool's checkpoint never ran"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Everything was copied into the database: the next commit writes the WAL afresh.
        fill(&store).await;
        let frames = wal_frames(&store);
        assert!(
            frames < 50,
            "the WAL holds {frames} frames after a checkpoint"
        );
    }

    #[tokio::test]
    async fn a_write_that_panics_commits_nothing_and_leaves_the_connection_usable() {
        let (_dir, store) = store();
        let failed = store
            .quick_write("writing in a test", |tx| -> Result<(), _> {
                tx.pragma_update(None, "user_version", 7)?;
                panic!("a bug in the write");
            })
            .await
            .unwrap_err();
        assert_eq!(failed.operation, "writing in a test");
        assert!(failed.to_string().contains("panicked"), "{failed}");
        assert_eq!(version(&store), 0);
        assert_eq!(write(&store, 8).await, thread::current().id());
        assert_eq!(version(&store), 8);
    }
}
