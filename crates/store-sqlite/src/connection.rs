//! `SqliteStore`: one SQLite connection behind a mutex, opened with the pragmas that let
//! several processes share the file, and a runner that moves each call off the runtime;
//! plus a second, read-only connection for the status watcher's batched reads (R6).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runwarden_vault::store::{StoreError, StoreFault};
use rusqlite::{Connection, OpenFlags};

use crate::failure::Failure;
use crate::migrate::migrate;
use crate::permissions::{create_private, database_files, tighten};

/// What a commit that a promise rests on survives: the write fence's mark and the audit
/// intent a request may not leave without. Every other commit survives a killed process
/// in both modes, and may be lost to a power cut in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Those commits are synced to disk before the store answers: they survive a killed
    /// process, an operating-system crash and a power cut. The default.
    #[default]
    PowerCut,
    /// Those commits reach the operating system but are not synced: they survive
    /// runwarden being killed (`kill -9`, the OOM killer), not an operating-system crash
    /// or a power cut. A power cut can then lose an intent or a fence mark whose request
    /// did go out, so a write may be sent again and `audit verify` reports the lost rows.
    ProcessCrash,
}

/// The embedded SQLite store. Clones share one write connection (and the read-only
/// connections beside it); open another store on the same path for a second writer (as
/// another process would).
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    path: PathBuf,
    /// What opening changed about the files' modes, for the operator's warning.
    tightened: Vec<String>,
    pub(crate) conn: Mutex<Connection>,
    /// R6: the status watcher's batched reads (and the step-boundary probe), which every
    /// call's first question waits on. A WAL reader of its own never waits behind `conn`'s
    /// mutex, the write gate or a writer's transactions.
    probe: Arc<Mutex<Connection>>,
    /// O5: reads that may cover a whole table: the counts every metrics scrape asks for
    /// (a tenth of a second per million rows) and the operator's lists of runs. On `conn`
    /// each would hold every write behind it for that long; on the probe, every call's
    /// first question.
    scan: Arc<Mutex<Connection>>,
    /// A fourth, read-only connection for one-row reads asked on every call (the secrets'
    /// version), run on the caller's own thread when nobody else is using it: the read
    /// takes microseconds, a trip to the blocking pool and back several times as long. It
    /// never waits for a lock (busy timeout 0); a read that would wait goes to the pool.
    quick: Mutex<Connection>,
    /// Two permits: one call runs on `conn` while the next waits ready on its mutex; the
    /// rest queue here as cheap futures rather than as blocked threads of tokio's pool. A
    /// burst (a thousand cancelled calls writing their audit rows at once) otherwise wakes
    /// a thousand threads to fight over one mutex on two cores. One permit would put a
    /// thread hand-off between every two calls and cost a quarter of the throughput.
    pub(crate) gate: Arc<tokio::sync::Semaphore>,
    /// The `-wal` and `-shm` files as opened: a call on `conn` is refused once one of them
    /// was deleted under this process.
    pub(crate) watched: crate::removed::Watched,
    /// A checkpoint a quick write left to the pool is queued (`quick_write`).
    pub(crate) checkpoint_due: AtomicBool,
    /// False under [`Durability::ProcessCrash`]: the commits a promise rests on are not
    /// synced either.
    syncs_promises: AtomicBool,
    /// O6: what this process committed, for live views, workers and the status watcher.
    feed: runwarden_runtime::ChangeFeed,
    /// Run events waiting to be committed together (`append_batch`).
    pub(crate) appends: crate::append_queue::Appends,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens the database at `path`, creating the file (not its directory) with mode 0600
    /// if missing, and applies any pending migrations.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        create_private(path).map_err(|e| {
            StoreError::with_fault(
                format!("creating the database at {}", path.display()),
                io_fault(&e),
                e,
            )
        })?;
        Self::open_with(path, OpenFlags::default())
    }

    /// Opens an existing database at `path` and applies any pending migrations; a missing
    /// file is an error that tells the operator to run `runwarden init`.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let no_create = OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE);
        if !path.is_file() {
            return Err(missing(path));
        }
        Self::open_with(path, no_create).map_err(|e| if path.is_file() { e } else { missing(path) })
    }

    /// Sets what the commits a promise rests on survive (the default is
    /// [`Durability::PowerCut`]); applies to every clone of this store.
    pub fn with_durability(self, durability: Durability) -> Self {
        let syncs = durability == Durability::PowerCut;
        self.inner.syncs_promises.store(syncs, Ordering::Relaxed);
        self
    }

    /// What the commits a promise rests on survive.
    pub fn durability(&self) -> Durability {
        if self.syncs_promises() {
            Durability::PowerCut
        } else {
            Durability::ProcessCrash
        }
    }

    /// Whether [`durably`] syncs: false under [`Durability::ProcessCrash`].
    pub(crate) fn syncs_promises(&self) -> bool {
        self.inner.syncs_promises.load(Ordering::Relaxed)
    }

    /// The database file this store was opened on.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// One line for each of the database's files (database, `-wal`, `-shm`) that other
    /// users could read when this store opened it, and that opening tightened to 0600 (or
    /// could not). The binary prints them as warnings.
    pub fn tightened(&self) -> &[String] {
        &self.inner.tightened
    }

    fn open_with(path: &Path, flags: OpenFlags) -> Result<Self, StoreError> {
        let operation = format!("opening the database at {}", path.display());
        let failed =
            |e: Failure, operation: &str| named_if_full(path, e.into_store_error(operation));
        let mut conn = Connection::open_with_flags(path, flags)
            .map_err(|e| failed(Failure::from(e), &operation))?;
        configure(&conn).map_err(|e| failed(e, &operation))?;
        migrate(&mut conn).map_err(|e| failed(e, "migrating the database"))?;
        // In place of SQLite's automatic checkpoint, which it keeps, except after a commit
        // made on a runtime thread (`quick_write`).
        conn.wal_hook(Some(crate::checkpoint::after_commit));
        // Opened after the migration, so the file exists, is in WAL mode and has its tables.
        let probe = open_probe(path).map_err(|e| failed(e, &operation))?;
        let quick = open_probe(path).map_err(|e| failed(e, &operation))?;
        let scan = open_probe(path).map_err(|e| failed(e, &operation))?;
        scan.busy_timeout(WRITER_BUSY_TIMEOUT)
            .map_err(|e| failed(Failure::from(e), &operation))?;
        quick
            .busy_timeout(Duration::ZERO)
            .map_err(|e| failed(Failure::from(e), &operation))?;
        // After both connections are open, so the -wal and -shm files exist to be checked.
        let tightened = tighten(&database_files(path));
        let watched = crate::removed::Watched::now(path, &database_files(path));
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                tightened,
                conn: Mutex::new(conn),
                probe: Arc::new(Mutex::new(probe)),
                scan: Arc::new(Mutex::new(scan)),
                quick: Mutex::new(quick),
                gate: Arc::new(tokio::sync::Semaphore::new(2)),
                watched,
                checkpoint_due: AtomicBool::new(false),
                syncs_promises: AtomicBool::new(true),
                feed: runwarden_runtime::ChangeFeed::new(),
                appends: Default::default(),
            }),
        })
    }

    /// A cheap readiness probe (`/readyz`): takes and releases the write lock and reads the
    /// schema version, waiting at most a quarter of a second for the lock. It fails when
    /// another process holds the write lock, or the file is read-only, damaged or cannot
    /// be opened, which is when the API answers writes with 503.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.run("checking that the store answers", |conn| {
            conn.busy_timeout(PROBE_BUSY_TIMEOUT)?;
            let probed = write_probe(conn);
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK"); // best effort: the commit failed
            }
            conn.busy_timeout(WRITER_BUSY_TIMEOUT)?;
            probed
        })
        .await
    }

    /// The shared state, for a task that must not keep the store alive.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// A handle on shared state taken back from [`SqliteStore::inner`].
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// O6: the feed this store publishes its committed run changes to.
    pub(crate) fn feed(&self) -> &runwarden_runtime::ChangeFeed {
        &self.inner.feed
    }

    /// Runs `work` with the connection on tokio's blocking pool. A poisoned lock or a
    /// panicking task becomes a `StoreError` naming `operation`, never a panic here.
    pub(crate) async fn run<T, F>(&self, operation: &'static str, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, Failure> + Send + 'static,
    {
        tracing::trace!(operation, "store call");
        let inner = Arc::clone(&self.inner);
        let permit = Arc::clone(&inner.gate)
            .acquire_owned()
            .await
            .map_err(|_| StoreError::new(operation, "the store is shut down"))?;
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit; // released when this work ends
            let mut conn = inner.conn.lock().map_err(|_| {
                StoreError::new(
                    operation,
                    "the connection was poisoned by an earlier panic: restart the process",
                )
            })?;
            inner.watched.check(&conn, operation)?;
            let before = conn.total_changes();
            let result = work(&mut conn).map_err(|e| e.into_store_error(operation));
            // Only a call that wrote shows that writes land again.
            let wrote = conn.total_changes() > before;
            Ok((result, wrote))
        });
        let outcome = task
            .await
            .map_err(|e| StoreError::new(operation, format!("the store task failed: {e}")))?;
        let (result, wrote) = match outcome {
            Ok((result, wrote)) => (result, wrote),
            Err(refused) => (Err(refused), false),
        };
        runwarden_runtime::observe_store_call(&result, wrote);
        result
    }

    /// Runs `work` with the read-only probe connection on tokio's blocking pool, outside
    /// the write gate. For short reads only (R5, R6); it never touches the write
    /// connection's mutex.
    pub(crate) async fn probe<T, F>(
        &self,
        operation: &'static str,
        work: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, Failure> + Send + 'static,
    {
        tracing::trace!(operation, "store read");
        read_on(Arc::clone(&self.inner.probe), "probe", operation, work).await
    }

    /// Runs `work`, a read over a whole table, with the read-only scan connection on
    /// tokio's blocking pool: it holds neither the write connection nor the probe while it
    /// reads, so writes and every call's first question go on beside it (O5).
    pub(crate) async fn scan<T, F>(&self, operation: &'static str, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, Failure> + Send + 'static,
    {
        tracing::trace!(operation, "store scan");
        read_on(Arc::clone(&self.inner.scan), "scan", operation, work).await
    }
}

/// Runs `work` with the read-only connection `conn` (named `name` in errors) on tokio's
/// blocking pool. A poisoned lock or a panicking task becomes a `StoreError`.
async fn read_on<T, F>(
    conn: Arc<Mutex<Connection>>,
    name: &'static str,
    operation: &'static str,
    work: F,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, Failure> + Send + 'static,
{
    let task = tokio::task::spawn_blocking(move || {
        let conn = conn.lock().map_err(|_| {
            StoreError::new(
                operation,
                format!(
                    "the {name} connection was poisoned by an earlier panic: restart the process"
                ),
            )
        })?;
        work(&conn).map_err(|e| e.into_store_error(operation))
    });
    task.await
        .map_err(|e| StoreError::new(operation, format!("the store task failed: {e}")))?
}

impl SqliteStore {
    /// Runs `work`, a read of a row or two, on the caller's thread with the quick
    /// connection when it is free and the read needs no lock; otherwise on the probe
    /// connection through the blocking pool, as [`probe`](Self::probe) does.
    pub(crate) async fn quick_read<T, F>(
        &self,
        operation: &'static str,
        work: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, Failure> + Send + 'static,
    {
        if let Ok(conn) = self.inner.quick.try_lock() {
            match work(&conn) {
                Err(Failure::Sql(rusqlite::Error::SqliteFailure(e, _)))
                    if matches!(
                        e.code,
                        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                    ) => {}
                done => return done.map_err(|e| e.into_store_error(operation)),
            }
        }
        self.probe(operation, move |conn| work(conn)).await
    }
}

/// A small real write, committed: the header's `user_version` (which nothing else uses)
/// moves by one. A store that is full, read-only, failing its I/O, locked or damaged
/// fails here, where a transaction that writes nothing would pass.
fn write_probe(conn: &Connection) -> Result<(), Failure> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let version: i32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let next = version.wrapping_add(1).max(0);
    conn.execute_batch(&format!("PRAGMA user_version = {next}; COMMIT"))?;
    Ok(())
}

/// Statements each connection keeps prepared.
const STATEMENT_CACHE: usize = 128;

/// How long a writer waits for another process's transaction before failing `Busy`.
pub(crate) const WRITER_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// O3: WAL and a busy timeout let `serve`, workers and the CLI share one file; a
/// writer waits up to five seconds for another process's transaction instead of failing.
fn configure(conn: &Connection) -> Result<(), Failure> {
    conn.busy_timeout(WRITER_BUSY_TIMEOUT)?;
    // Read before set: a database already in WAL mode is not touched, so opening takes
    // no lock that another process's write transaction could hold.
    let current: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    let mode = if current.eq_ignore_ascii_case("wal") {
        current
    } else {
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?
    };
    if !mode.eq_ignore_ascii_case("wal") {
        let problem =
            format!("the database stayed in {mode} mode instead of WAL: put it on a local disk");
        return Err(StoreError::new("opening the database", problem).into());
    }
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // The run path alone runs a few dozen distinct statements on the write connection;
    // rusqlite's default cache of 16 would parse most of them again on every step.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Runs `work` with `synchronous=FULL` when `sync` is true, so its commit syncs the WAL
/// before it answers, and puts the store back to `NORMAL` whatever `work` returned. The
/// store keeps `NORMAL` (a commit survives a killed process, not a power cut); the few
/// writes a promise rests on pay for the sync: the audit intent a request may not leave
/// without (V7), and the write fence's mark that keeps a write from being sent twice (R7).
/// `sync` is false only under [`Durability::ProcessCrash`], which the operator chose.
pub(crate) fn durably<T>(
    conn: &mut Connection,
    sync: bool,
    work: impl FnOnce(&mut Connection) -> Result<T, Failure>,
) -> Result<T, Failure> {
    if !sync {
        return work(conn);
    }
    // Cached statements: every synced write runs both, so neither is parsed again.
    conn.prepare_cached("PRAGMA synchronous = FULL")?
        .execute([])?;
    let done = work(conn);
    let restored = conn
        .prepare_cached("PRAGMA synchronous = NORMAL")
        .and_then(|mut stmt| stmt.execute([]));
    let value = done?;
    restored?;
    Ok(value)
}

/// The probe connection: read-only, so it can never take the write lock, and with a short
/// busy timeout, because a WAL reader only waits in rare cases (another connection
/// recovering the WAL index) and the signal that asks must never stall for long (R6, V6).
fn open_probe(path: &Path) -> Result<Connection, Failure> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(PROBE_BUSY_TIMEOUT)?;
    Ok(conn)
}

/// How long the probe waits for a lock before answering with an error (read fail-soft by
/// the runtime as "not cancelled", R5/R6).
const PROBE_BUSY_TIMEOUT: Duration = Duration::from_millis(250);

fn missing(path: &Path) -> StoreError {
    StoreError::new(
        "opening the database",
        format!("no database at {}: run `runwarden init`", path.display()),
    )
}

/// The fault behind a failed file operation of our own (not SQLite's).
/// An I/O error while the file system holding `path` has no byte left is a full disk:
/// SQLite reports a shared-memory file it could not grow as a plain I/O error.
fn named_if_full(path: &Path, error: StoreError) -> StoreError {
    if !matches!(error.fault, StoreFault::Io | StoreFault::DiskFull) {
        return error;
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    match rustix::fs::statvfs(dir.unwrap_or(Path::new("."))) {
        Ok(stats) if stats.f_bavail == 0 => StoreError::with_fault(
            error.operation,
            StoreFault::DiskFull,
            format!(
                "the disk holding {} is full: free space on that file system",
                path.display()
            ),
        ),
        _ => error,
    }
}

fn io_fault(error: &std::io::Error) -> StoreFault {
    match error.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            StoreFault::ReadOnly
        }
        std::io::ErrorKind::StorageFull => StoreFault::DiskFull,
        _ if crate::failure::is_out_of_files(error) => StoreFault::TooManyFiles,
        _ => StoreFault::Io,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runwarden_runtime::store::{RunFilter, RunStore};
    use runwarden_vault::store::VaultStore;

    use super::SqliteStore;

    /// A metrics scrape counts, and an operator lists runs, on a connection of their own:
    /// while the write connection is held, as a long write holds it, they still answer,
    /// and they see every committed row.
    #[tokio::test]
    async fn scrapes_and_lists_do_not_wait_for_the_write_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.db");
        let store = SqliteStore::open(&path).unwrap();
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "INSERT INTO audit_log (id, time_ms, action, success, method, host, path,
                     status, duration_ms, actor, prev_hash, hash)
                 VALUES (1, 1, 'http_call_started', 1, 'POST', 'h', '/', 0, 0, 'a', zeroblob(32), zeroblob(32)),
                        (2, 2, 'http_call_answered', 1, 'POST', 'h', '/', 200, 1, 'a', zeroblob(32), zeroblob(32))",
            )
            .unwrap();
        // A thread holds the write connection, as a long write does, until released.
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let inner = std::sync::Arc::clone(store.inner());
        let holder = std::thread::spawn(move || {
            let _conn = inner.conn.lock().unwrap();
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        held_rx.await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(30), async {
            let listed = store.run_list(RunFilter::default()).await;
            (listed, store.run_counts().await, store.audit_counts().await)
        })
        .await;
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        let (listed, runs, rows) =
            answered.expect("the reads answered while a write held the connection");
        assert_eq!(listed.unwrap(), vec![]);
        assert_eq!(runs.unwrap(), vec![]);
        assert_eq!(
            rows.unwrap(),
            vec![
                ("http_call_answered".to_string(), 1),
                ("http_call_started".to_string(), 1)
            ]
        );
    }
}
