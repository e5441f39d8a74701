//! Faults only a real server can show: a stopped server is a retryable I/O fault whose
//! message says what to do, the listener resynchronises after the server comes back, and
//! a password in the URL never reaches an error or `Debug`.

use std::time::Duration;

use runwarden_runtime::Change;
use runwarden_runtime::store::RunStore;
use runwarden_store_postgres::{PgOptions, PgStore};
use runwarden_testkit::TempCluster;
use runwarden_vault::store::{SealedKind, StoreFault, VaultStore};

use crate::common::{TestDb, audit_event, until};

const SIGIL: &str = "SIGIL-pg-password-7f3a";

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_is_a_retryable_io_fault_and_the_feed_resyncs_when_it_returns() {
    let mut db = TestDb::on(TempCluster::start_owned()).await;
    let store = db.node().await;
    let mut feed = store.change_feed().subscribe();
    store.ready().await.expect("ready while the server runs");

    db.cluster.stop();
    let error = store
        .sealed_list(SealedKind::Secret)
        .await
        .expect_err("no answer from a stopped server");
    assert_eq!(error.fault, StoreFault::Io, "{error}");
    assert!(error.is_retryable());
    assert!(
        error.message.contains("check that it is running"),
        "the message says what to do: {error}"
    );
    let error = store.ready().await.expect_err("not ready while stopped");
    assert!(error.is_unavailable(), "{error}");

    db.cluster.restart();
    let resync = async {
        loop {
            if feed.recv().await == Ok(Change::Resync) {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), resync)
        .await
        .expect("the listener reconnects and publishes Resync");
    let mut answered = false;
    // The pool drops connections the restart broke; a few calls may still meet one.
    for _ in 0..20 {
        if store.sealed_list(SealedKind::Secret).await.is_ok() {
            answered = true;
            break;
        }
    }
    assert!(answered, "the store answers again once the server is back");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connection_is_io_and_never_shows_the_password() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("postgres://runwarden:{SIGIL}@127.0.0.1:{port}/runwarden");
    let error = PgStore::connect(&url)
        .await
        .expect_err("nothing listens on that port");
    assert_eq!(error.fault, StoreFault::Io, "{error}");
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains(SIGIL), "{shown}");
    assert!(
        shown.contains("[redacted]"),
        "the URL is named, redacted: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_in_the_url_never_appears_in_debug() {
    let db = TestDb::new().await;
    // The test server trusts loopback, so the password is accepted and ignored.
    let url = db
        .url
        .replacen("runwarden@", &format!("runwarden:{SIGIL}@"), 1);
    assert!(url.contains(SIGIL));
    let store = PgStore::connect(&url)
        .await
        .expect("connect with a password");
    let shown = format!("{store:?} {}", store.redacted_url());
    assert!(!shown.contains(SIGIL), "{shown}");
    assert!(shown.contains("[redacted]"), "{shown}");
    let bad = url.replace(SIGIL, &format!("{SIGIL}%zz")) + "?sslmode=nonsense";
    if let Err(error) = PgStore::connect(&bad).await {
        assert!(!format!("{error} {error:?}").contains(SIGIL), "{error}");
    }
}

/// A pool of one connection held by a slow caller: the next call waits the configured
/// bound and fails with a retryable fault, instead of hanging.
#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_pool_fails_retryable_after_its_wait() {
    let db = TestDb::new().await;
    let options = PgOptions {
        max_connections: 1,
        pool_wait: Duration::from_millis(200),
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&db.url, options).await.unwrap();
    // Another session holds the audit lock (AUDIT_LOCK in vault_store.rs, "rwaudit!").
    let (holder, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(8248168399376053281);")
        .await
        .unwrap();
    let blocked = {
        let store = store.clone();
        tokio::spawn(async move {
            let chain =
                std::sync::Arc::new(runwarden_vault::audit::AuditChain::from_audit_key(&[7; 32]));
            store.audit_append(audit_event(), chain).await
        })
    };
    // The blocked append holds the pool's only connection; wait until the server shows
    // it waiting on the lock.
    let waiting = async {
        loop {
            let rows = holder
                .query(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
                    &[],
                )
                .await
                .unwrap();
            if !rows.is_empty() {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the append waits on the audit lock");
    let error = store
        .sealed_list(SealedKind::Secret)
        .await
        .expect_err("no connection is free");
    assert_eq!(error.fault, StoreFault::Io, "{error}");
    assert!(error.is_retryable());
    holder.batch_execute("COMMIT").await.unwrap();
    let row = tokio::time::timeout(Duration::from_secs(5), blocked)
        .await
        .expect("the append goes on once the lock is released")
        .unwrap()
        .expect("the append succeeds");
    assert_eq!(row.id, 1);
}

/// Another session holding the audit lock ("rwaudit!"), so an audit append waits.
async fn hold_the_audit_lock(url: &str) -> tokio_postgres::Client {
    let (holder, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(8248168399376053281);")
        .await
        .unwrap();
    holder
}

/// Every store call is bounded: the server cancels a statement past `statement_timeout`
/// (a retryable `Busy`), and a call past the client's own deadline fails as a retryable
/// `Io` whose connection leaves the pool, so the next call on a pool of one does not wait
/// behind it.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_past_its_bounds_fails_retryable_and_its_connection_leaves_the_pool() {
    let db = TestDb::new().await;
    let chain = std::sync::Arc::new(runwarden_vault::audit::AuditChain::from_audit_key(&[7; 32]));
    let holder = hold_the_audit_lock(&db.url).await;

    let server_bound = PgOptions {
        max_connections: 1,
        statement_timeout: Duration::from_millis(300),
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&db.url, server_bound).await.unwrap();
    let since = std::time::Instant::now();
    let error = store
        .audit_append(audit_event(), chain.clone())
        .await
        .expect_err("the lock is held past the statement timeout");
    assert_eq!(error.fault, StoreFault::Busy, "{error}");
    assert!(error.is_retryable());
    assert!(
        since.elapsed() < Duration::from_secs(3),
        "{:?}",
        since.elapsed()
    );

    let client_bound = PgOptions {
        max_connections: 1,
        call_timeout: Duration::from_millis(500),
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&db.url, client_bound).await.unwrap();
    let since = std::time::Instant::now();
    let error = store
        .audit_append(audit_event(), chain)
        .await
        .expect_err("the lock is held past the call's deadline");
    assert_eq!(error.fault, StoreFault::Io, "{error}");
    assert!(error.message.contains("did not answer within"), "{error}");
    assert!(
        since.elapsed() < Duration::from_secs(3),
        "{:?}",
        since.elapsed()
    );
    // The pool's only connection was waiting on the lock: it was dropped, so this call
    // gets a new one at once while the lock is still held.
    let listed = tokio::time::timeout(
        Duration::from_secs(2),
        store.sealed_list(SealedKind::Secret),
    )
    .await
    .expect("the next call does not queue behind the abandoned one");
    assert!(listed.unwrap().is_empty());
    holder.batch_execute("COMMIT").await.unwrap();
}

/// V7: the server refuses a row in the middle of a batch (PostgreSQL text cannot hold a
/// NUL byte), after the lock and the tip were read in the first flight of statements: no
/// row of the batch is stored, the tip stays, and the only connection of the pool is back
/// out of the transaction, so the next append continues the chain.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_the_server_refuses_mid_batch_stores_none_of_it_and_the_chain_goes_on() {
    let db = TestDb::new().await;
    let chain = std::sync::Arc::new(runwarden_vault::audit::AuditChain::from_audit_key(&[5; 32]));
    let one = PgOptions {
        max_connections: 1,
        ..PgOptions::default()
    };
    let store = PgStore::connect_with(&db.url, one).await.unwrap();
    let first = store
        .audit_append(audit_event(), chain.clone())
        .await
        .unwrap();
    assert_eq!(first.id, 1);
    let tip = store.audit_tip().await.unwrap();
    let refused = runwarden_vault::audit::AuditEvent {
        path: "/a\0b".into(),
        ..audit_event()
    };
    let error = store
        .audit_append_many(vec![audit_event(), refused, audit_event()], chain.clone())
        .await
        .expect_err("the server refuses the row with a NUL byte");
    assert!(!error.message.is_empty());
    assert_eq!(store.audit_tip().await.unwrap(), tip, "the tip stays");
    let rows = store
        .audit_list(runwarden_vault::store::AuditFilter::default())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "no row of the failed batch is stored");
    let next = store
        .audit_append_many(vec![audit_event(), audit_event()], chain)
        .await
        .expect("the next batch goes on the same connection");
    let ids: Vec<i64> = next.iter().map(|row| row.id).collect();
    assert_eq!(ids, [2, 3], "the chain continues from the tip");
    assert_eq!(next[0].prev_hash, first.hash);
}

/// An append dropped by its caller while its transaction is open (the guard waits for a
/// row another session holds) takes its connection out of the pool: no later call runs
/// inside the transaction it left, and the server ends it.
#[tokio::test(flavor = "multi_thread")]
async fn an_append_dropped_inside_its_transaction_never_returns_that_connection_to_the_pool() {
    use runwarden_runtime::store::{EventAppend, NewRunStatus, RunCreate};
    let db = TestDb::new().await;
    // The server's own net for a silent client is set beyond the test's wait, so only the
    // pool's handling can end that transaction in time.
    let one = PgOptions {
        max_connections: 1,
        idle_in_transaction_timeout: Duration::from_secs(120),
        ..PgOptions::default()
    };
    let store = std::sync::Arc::new(PgStore::connect_with(&db.url, one).await.unwrap());
    let now = crate::common::now_ms();
    store
        .run_create(RunCreate {
            id: "dropped-1".into(),
            agent: "helpdesk".into(),
            correlation: "dropped-1".into(),
            request: None,
            status: NewRunStatus::Running {
                owner: "worker-a".into(),
                lease_until_ms: now + 60_000,
            },
            now_ms: now,
            origin: Default::default(),
        })
        .await
        .unwrap();
    let epoch = store
        .run_get("dropped-1")
        .await
        .unwrap()
        .unwrap()
        .claim_epoch;
    let (watcher, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    watcher
        .batch_execute("BEGIN; SELECT id FROM runs WHERE id = 'dropped-1' FOR UPDATE")
        .await
        .unwrap();
    let appending = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .run_event_append(EventAppend {
                    id: "dropped-1".into(),
                    owner: "worker-a".into(),
                    epoch,
                    kind: "tool_executed".into(),
                    payload: serde_json::json!({}),
                    clear_fence: false,
                    round: None,
                    end: None,
                    now_ms: now,
                    before: None,
                })
                .await
        })
    };
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    until(&watcher, waiting, 1..=1).await;
    appending.abort();
    assert!(appending.await.unwrap_err().is_cancelled());
    watcher.batch_execute("COMMIT").await.unwrap();
    let in_transaction = "SELECT count(*) FROM pg_stat_activity
                          WHERE datname = current_database() AND pid <> pg_backend_pid()
                            AND state LIKE 'idle in transaction%'";
    until(&watcher, in_transaction, 0..=0).await;
    let events = tokio::time::timeout(Duration::from_secs(5), store.run_events("dropped-1", 0, 0))
        .await
        .expect("the pool gives a working connection")
        .unwrap();
    assert!(
        events.is_empty(),
        "the dropped append stored nothing: {events:?}"
    );
    until(&watcher, in_transaction, 0..=0).await;
}
