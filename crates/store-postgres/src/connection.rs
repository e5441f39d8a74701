//! `PgStore`: a connection pool over one PostgreSQL database, the migrations applied at
//! connect, the listener that carries every node's changes into this process's feed
//! (O6), and the password redaction that keeps the database URL out of errors and logs.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use runwarden_runtime::ChangeFeed;
use runwarden_vault::store::{StoreError, StoreFault};
use tokio_postgres::NoTls;

use crate::failure::Failure;
use crate::listener::Listener;
use crate::migrate::migrate;

/// How a [`PgStore`] sizes and bounds its pool. `Default` is 16 connections and a 5 s wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgOptions {
    /// How many pooled connections one store (one node) keeps at most; the change
    /// listener's connection comes on top.
    pub max_connections: usize,
    /// How long a call waits for a free pooled connection, or for a new one to open,
    /// before failing with a retryable [`StoreFault::Io`].
    pub pool_wait: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            pool_wait: Duration::from_secs(5),
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
    /// The URL with its password replaced, for `Debug` and error messages.
    target: String,
    /// O6: every node's committed run changes, as heard by the listener.
    feed: ChangeFeed,
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
        let manager = Manager::from_config(
            config.clone(),
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
        let listener = Listener::start(config, feed.clone())
            .await
            .map_err(scrubbed)?;
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                target,
                feed,
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

    /// O6: the feed this store's listener publishes every node's committed changes to.
    pub(crate) fn feed(&self) -> &ChangeFeed {
        &self.inner.feed
    }

    /// A pooled connection.
    pub(crate) async fn client(&self) -> Result<Object, Failure> {
        Ok(self.inner.pool.get().await?)
    }

    /// Runs `work` and names `operation` in its error.
    pub(crate) async fn with<T>(
        &self,
        operation: &str,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, StoreError> {
        work.await.map_err(|e| e.into_store_error(operation))
    }
}

/// The URL with any password replaced by `[redacted]`; text that does not parse as a URL
/// is not shown at all (it might be a key/value string holding a password).
pub fn redact_url(url: &str) -> String {
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
