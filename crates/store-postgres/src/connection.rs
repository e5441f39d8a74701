//! `PgStore`: a connection pool over one PostgreSQL database, the migrations applied at
//! connect, the listener that carries every node's changes into this process's feed
//! (O6), the bounds that keep every store call finite (a server-side statement timeout,
//! TCP keepalives, a pool wait and a client-side deadline), and the password redaction
//! that keeps the database URL out of errors and logs.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use runwarden_runtime::ChangeFeed;
use runwarden_vault::store::{StoreError, StoreFault};
use tokio_postgres::NoTls;

use crate::append_queue::Appends;
use crate::failure::Failure;
use crate::keepalive::keepalives;
use crate::listener::Listener;
use crate::migrate::migrate;

/// How a [`PgStore`] sizes and bounds its pool and its calls. `Default`: 16 connections,
/// a 5 s pool wait, a 10 s statement timeout, a 10 s idle-in-transaction timeout and a
/// 20 s deadline on each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgOptions {
    /// How many pooled connections one store (one node) keeps at most; the change
    /// listener's connection comes on top.
    pub max_connections: usize,
    /// How long a call waits for a free pooled connection, or for a new one to open,
    /// before failing with a retryable [`StoreFault::Io`].
    pub pool_wait: Duration,
    /// The server cancels a statement that runs longer (`statement_timeout` on every
    /// pooled connection); the call fails with a retryable [`StoreFault::Busy`].
    pub statement_timeout: Duration,
    /// The server ends a session that sits this long inside an open transaction
    /// (`idle_in_transaction_session_timeout`), so a client that went silent mid-transaction
    /// cannot hold its row locks for longer.
    pub idle_in_transaction_timeout: Duration,
    /// The client's own bound on a whole store call (pool wait, statements, commit). A call
    /// past it fails with a retryable [`StoreFault::Io`] and its connection leaves the pool:
    /// this is what ends a wait on a link that stays open but carries no answer.
    pub call_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            pool_wait: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(20),
        }
    }
}

tokio::task_local! {
    /// Set when the store call running on this task passed its deadline: a connection it
    /// took is then dropped instead of going back to the pool, where its next user would
    /// queue behind an answer that may never come.
    static ABANDONED: Arc<AtomicBool>;
}

/// A pooled connection taken inside a store call. Dereferences to the pool's object; on
/// drop it goes back to the pool, unless its call was abandoned at the deadline or it may
/// hold an open transaction: then it leaves the pool, and the server is asked to cancel
/// whatever it still runs for it.
pub(crate) struct Conn {
    object: Option<Object>,
    abandoned: Arc<AtomicBool>,
    /// A transaction opened by hand (see `flight`) is not known to be ended: dropped now,
    /// the connection leaves the pool too, so no other call runs inside that transaction.
    open: AtomicBool,
}

impl Conn {
    /// The plain client, for helpers written over `GenericClient`.
    pub(crate) fn plain(&self) -> &tokio_postgres::Client {
        self
    }

    /// Records whether a transaction opened by hand may still be open on the connection.
    pub(crate) fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
    }
}

impl Deref for Conn {
    type Target = Object;
    fn deref(&self) -> &Object {
        self.object.as_ref().expect("present until drop")
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Object {
        self.object.as_mut().expect("present until drop")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.abandoned.load(Ordering::SeqCst) && !self.open.load(Ordering::SeqCst) {
            return;
        }
        let Some(object) = self.object.take() else {
            return;
        };
        let client = Object::take(object);
        let token = client.cancel_token();
        drop(client);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = tokio::time::timeout(CONNECT_TIMEOUT, token.cancel_query(NoTls)).await;
            });
        }
    }
}
/// How long opening a TCP connection to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`PgStore::ready`] waits for the server's answer.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// The PostgreSQL store. Clones share one pool, one feed and one listener; many stores
/// (many nodes) may share one database. Its `Debug` shows the URL with the password
/// replaced by `[redacted]`.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// The bounds the store was opened with.
    options: PgOptions,
    /// The URL with its password replaced, for `Debug` and error messages.
    target: String,
    /// O6: every node's committed run changes, as heard by the listener.
    feed: ChangeFeed,
    /// Run events waiting to share a transaction (see `append_batch`).
    appends: Appends,
    /// Stops the listener when the last clone of the store is dropped.
    _listener: Listener,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.inner.target)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`),
    /// applies any pending migrations under an advisory lock (so nodes starting together
    /// apply each one once), and starts listening for every node's changes. The password
    /// never appears in an error. Must be called on a tokio runtime.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// [`connect`](Self::connect) with a pool sized and bounded by `options`.
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        if options.max_connections == 0 {
            return Err(StoreError::new(
                "connecting to the database",
                "the pool needs at least one connection: set max_connections to 1 or more",
            ));
        }
        let target = redact_url(url);
        let operation = format!("connecting to the database at {target}");
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
            StoreError::new(
                &operation,
                format!(
                    "the database URL is not valid ({}): write it as postgres://user:password@host:port/database",
                    scrub(&e.to_string(), url)
                ),
            )
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("runwarden");
        }
        // The listener keeps its own connection, without the statement bounds (it only
        // waits for notifications) but with keepalives.
        let listener_config = config.clone();
        keepalives(&mut config);
        let bounds = format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            options.statement_timeout.as_millis().max(1),
            options.idle_in_transaction_timeout.as_millis().max(1),
        );
        let startup = match config.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{given} {bounds}"),
            _ => bounds,
        };
        config.options(startup);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.pool_wait))
            .create_timeout(Some(options.pool_wait))
            .recycle_timeout(Some(options.pool_wait))
            .build()
            .map_err(|e| StoreError::new(&operation, format!("building the pool failed: {e}")))?;
        let scrubbed = |e: Failure| {
            let mut error = e.into_store_error(&operation);
            error.message = scrub(&error.message, url);
            error
        };
        {
            let mut client = pool.get().await.map_err(|e| scrubbed(e.into()))?;
            migrate(&mut client).await.map_err(|e| {
                let mut error = e.into_store_error("migrating the database");
                error.message = scrub(&error.message, url);
                error
            })?;
        }
        let feed = ChangeFeed::new();
        // O6: listening starts before `connect` answers, so every change committed after
        // it (by any node) reaches this feed.
        let listener = Listener::start(listener_config, feed.clone())
            .await
            .map_err(scrubbed)?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                options,
                target,
                feed,
                appends: Default::default(),
                _listener: listener,
            }),
        })
    }

    /// A cheap readiness probe (`/readyz`): one round trip on a pooled connection that
    /// also asks whether the server accepts writes, answered within a second. It fails when
    /// the server is down or unreachable, the pool is exhausted, or the server is a
    /// read-only standby, which is when the API answers writes with 503.
    pub async fn ready(&self) -> Result<(), StoreError> {
        const OPERATION: &str = "checking that the store answers";
        let probe = self.with(OPERATION, async {
            let client = self.client().await?;
            let row = client
                .query_one(
                    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
                    &[],
                )
                .await?;
            Ok(row.get::<_, bool>(0))
        });
        let read_only = tokio::time::timeout(READY_TIMEOUT, probe)
            .await
            .map_err(|_| {
                StoreError::with_fault(
                    OPERATION,
                    StoreFault::Io,
                    format!(
                        "the database at {} did not answer within {READY_TIMEOUT:?}: check that \
                         the server is up and reachable, then retry",
                        self.inner.target
                    ),
                )
            })??;
        if read_only {
            return Err(StoreError::with_fault(
                OPERATION,
                StoreFault::ReadOnly,
                format!(
                    "the database at {} accepts no writes (a standby or read-only server): \
                     point [store] url at the primary",
                    self.inner.target
                ),
            ));
        }
        Ok(())
    }

    /// The URL this store connected to, with its password replaced by `[redacted]`.
    pub fn redacted_url(&self) -> &str {
        &self.inner.target
    }

    /// The run events waiting to share a transaction.
    pub(crate) fn appends(&self) -> &Appends {
        &self.inner.appends
    }

    /// O6: the feed this store's listener publishes every node's committed changes to.
    pub(crate) fn feed(&self) -> &ChangeFeed {
        &self.inner.feed
    }

    /// A pooled connection, tied to the store call running on this task (see [`Conn`]).
    pub(crate) async fn client(&self) -> Result<Conn, Failure> {
        let object = self.inner.pool.get().await?;
        let abandoned = ABANDONED
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(AtomicBool::new(false)));
        Ok(Conn {
            object: Some(object),
            abandoned,
            open: AtomicBool::new(false),
        })
    }

    /// Runs `work` within the call deadline and names `operation` in its error. A call
    /// past the deadline fails with [`StoreFault::Io`]; whether a write it made was
    /// committed is then unknown, so a caller that acts on a write re-reads first (see
    /// [`PgStore::confirm`]).
    pub(crate) async fn with<T>(
        &self,
        operation: &str,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, StoreError> {
        // A call inside another shares its flag: abandoning the outer abandons both.
        let abandoned = ABANDONED
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(AtomicBool::new(false)));
        let mut work = Box::pin(ABANDONED.scope(abandoned.clone(), work));
        let deadline = self.inner.options.call_timeout;
        let result = match tokio::time::timeout(deadline, &mut work).await {
            Ok(result) => result.map_err(|e| e.into_store_error(operation)),
            Err(_) => {
                abandoned.store(true, Ordering::SeqCst);
                drop(work);
                tracing::warn!(
                    operation,
                    ?deadline,
                    "a store call passed its deadline; its connection was dropped"
                );
                Err(StoreError::with_fault(
                    operation,
                    StoreFault::Io,
                    format!(
                        "the database at {} did not answer within {deadline:?} (a write this \
                         call made may or may not be stored): check that the server is up and \
                         reachable, or raise [store] call_timeout_seconds",
                        self.inner.target
                    ),
                ))
            }
        };
        // A round trip that succeeded shows the server reachable and answering.
        runwarden_runtime::observe_store_call(&result, true);
        result
    }

    /// A write whose answer was lost (the connection broke or went silent after the
    /// statement or its COMMIT was sent) may have been stored. `reread`, on a fresh
    /// connection, says what the row shows: `Some(answer)` when the write is there, and
    /// then that is the call's answer; otherwise the original error stands. Any other
    /// error passes through unchanged.
    pub(crate) async fn confirm<T, F>(
        &self,
        result: Result<T, StoreError>,
        operation: &str,
        reread: impl FnOnce() -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<Option<T>, Failure>>,
    {
        match result {
            Err(error) if runwarden_runtime::outcome_unknown(&error) => {
                let found = self.with(operation, reread()).await;
                runwarden_runtime::after_reread(error, operation, found)
            }
            other => other,
        }
    }
}

/// The URL with any password replaced by `[redacted]`; text that does not parse as a URL
/// is not shown at all (it might be a key/value string holding a password).
pub(crate) fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Setting a password only fails on URLs that cannot have one.
                let _ = parsed.set_password(Some("[redacted]"));
            }
            // Key/value parameters may carry a password too (`?password=...`).
            if parsed.query().is_some_and(|q| q.contains("password")) {
                parsed.set_query(Some("[redacted]"));
            }
            parsed.to_string().replace("%5Bredacted%5D", "[redacted]")
        }
        Err(_) => "[a database URL that is not a URL]".to_owned(),
    }
}

/// Removes every form of the URL's password (raw and percent-decoded) from `text`.
fn scrub(text: &str, url: &str) -> String {
    let mut out = text.to_owned();
    let mut secrets = Vec::new();
    if let Ok(parsed) = url::Url::parse(url) {
        if let Some(password) = parsed.password() {
            secrets.push(password.to_owned());
            let pair = format!("p={password}");
            if let Some((_, decoded)) = url::form_urlencoded::parse(pair.as_bytes()).next() {
                secrets.push(decoded.into_owned());
            }
        }
        for (key, value) in parsed.query_pairs() {
            if key == "password" {
                secrets.push(value.into_owned());
            }
        }
    }
    for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
        out = out.replace(&secret, "[redacted]");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_the_url_is_redacted() {
        let shown = redact_url("postgres://runwarden:hunter2-SIGIL@db.internal:5432/rw");
        assert_eq!(shown, "postgres://runwarden:[redacted]@db.internal:5432/rw");
        assert!(!shown.contains("SIGIL"));
    }

    #[test]
    fn a_password_in_the_query_is_redacted() {
        let shown = redact_url("postgres://db.internal/rw?user=a&password=SIGIL");
        assert!(!shown.contains("SIGIL"), "{shown}");
    }

    #[test]
    fn text_that_is_not_a_url_is_never_echoed() {
        let shown = redact_url("host=db password=SIGIL");
        assert!(!shown.contains("SIGIL"), "{shown}");
    }

    #[test]
    fn scrub_removes_raw_and_decoded_passwords() {
        let url = "postgres://u:p%40SIGIL@h/d";
        let text = scrub("failed for p%40SIGIL and p@SIGIL", url);
        assert!(!text.contains("SIGIL"), "{text}");
    }
}
