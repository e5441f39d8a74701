//! Shared test fixtures: a vault over a real SQLite file, a store that counts secret reads
//! and fails audit appends on demand, and resolvers that serve scripted answers. The
//! servers the tests call are the testkit's (`runwarden_testkit::TestServer`).

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::audit::{AuditChain, AuditTip};
use runwarden_vault::store::{
    AuditFilter, RewrapFn, SealedKind, SealedMeta, SealedRecord, StoreError, VaultStore,
};
use runwarden_vault::{
    Algorithm, AuditEvent, AuditRow, EgressClient, EgressConfig, EgressPolicy, MasterKey, Resolver,
    SecretName, SecretValue, Vault,
};
use tempfile::TempDir;

/// The value every test secret carries; it must never surface anywhere but the wire.
pub const SIGIL: &str = "sigil-7c1f9e2a-never-print";

/// A real SQLite store that counts how often a secret's ciphertext is read and how many
/// audit transactions ran, and whose audit appends can be made to fail (a store fault we
/// cannot cause on demand for real without failing every other read too).
pub struct CountingStore {
    pub inner: SqliteStore,
    pub secret_reads: AtomicUsize,
    /// Audit transactions (`audit_append` and `audit_append_many` calls) that committed.
    pub audit_batches: AtomicUsize,
    /// The next this many audit appends fail, as a locked or full database would.
    pub fail_next: AtomicUsize,
    /// When set, every audit append after the next N ones fails (N counts down).
    pub appends_left: std::sync::Mutex<Option<usize>>,
}

impl CountingStore {
    fn append_allowed(&self) -> Result<(), StoreError> {
        let mut left = self.appends_left.lock().unwrap();
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let refused = failing
            || match left.as_mut() {
                Some(0) => true,
                Some(n) => {
                    *n -= 1;
                    false
                }
                None => false,
            };
        if refused {
            return Err(StoreError::new(
                "appending audit rows",
                "database is locked",
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl VaultStore for CountingStore {
    async fn sealed_get(
        &self,
        kind: SealedKind,
        name: &str,
    ) -> Result<Option<SealedRecord>, StoreError> {
        if kind == SealedKind::Secret {
            self.secret_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.sealed_get(kind, name).await
    }
    async fn sealed_put(&self, record: SealedRecord) -> Result<(), StoreError> {
        self.inner.sealed_put(record).await
    }
    async fn sealed_insert_new(&self, record: SealedRecord) -> Result<bool, StoreError> {
        self.inner.sealed_insert_new(record).await
    }
    async fn sealed_delete(&self, kind: SealedKind, name: &str) -> Result<bool, StoreError> {
        self.inner.sealed_delete(kind, name).await
    }
    async fn sealed_list(&self, kind: SealedKind) -> Result<Vec<SealedMeta>, StoreError> {
        self.inner.sealed_list(kind).await
    }
    async fn sealed_secrets_version(&self) -> Result<u64, StoreError> {
        self.inner.sealed_secrets_version().await
    }
    async fn sealed_rewrap_all(&self, rewrap: RewrapFn) -> Result<usize, StoreError> {
        self.inner.sealed_rewrap_all(rewrap).await
    }
    async fn audit_append(
        &self,
        event: AuditEvent,
        chain: Arc<AuditChain>,
    ) -> Result<AuditRow, StoreError> {
        self.append_allowed()?;
        let row = self.inner.audit_append(event, chain).await?;
        self.audit_batches.fetch_add(1, Ordering::SeqCst);
        Ok(row)
    }
    async fn audit_append_many(
        &self,
        events: Vec<AuditEvent>,
        chain: Arc<AuditChain>,
    ) -> Result<Vec<AuditRow>, StoreError> {
        self.append_allowed()?;
        let rows = self.inner.audit_append_many(events, chain).await?;
        self.audit_batches.fetch_add(1, Ordering::SeqCst);
        Ok(rows)
    }
    async fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Result<Vec<i64>, StoreError> {
        self.inner.audit_incomplete(intent_ids).await
    }
    async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, StoreError> {
        self.inner.audit_list(filter).await
    }
    async fn audit_tip(&self) -> Result<Option<AuditTip>, StoreError> {
        self.inner.audit_tip().await
    }
    async fn audit_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.audit_counts().await
    }
    async fn oauth_lease_acquire(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        self.inner
            .oauth_lease_acquire(key, holder, now_ms, expires_ms)
            .await
    }
    async fn oauth_lease_release(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.inner.oauth_lease_release(key, holder).await
    }
}

/// Answers from a fixed table; a name may get a different answer on later lookups
/// (DNS rebinding). Counts lookups.
#[derive(Default)]
pub struct ScriptedResolver {
    answers: HashMap<String, Vec<Vec<IpAddr>>>,
    pub lookups: AtomicUsize,
}

impl ScriptedResolver {
    /// `name` answers `first` on its first lookup and `later` on every other one.
    pub fn with(mut self, name: &str, first: &[&str], later: &[&str]) -> Self {
        let parse = |list: &[&str]| {
            list.iter()
                .map(|a| a.parse().unwrap())
                .collect::<Vec<IpAddr>>()
        };
        self.answers
            .insert(name.to_string(), vec![parse(first), parse(later)]);
        self
    }
}

#[async_trait]
impl Resolver for ScriptedResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        match self.answers.get(host) {
            Some(answers) => Ok(answers[n.min(1)].clone()),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "no such host")),
        }
    }
}

/// A vault over a fresh SQLite file, with an egress client.
pub struct Fixture {
    pub dir: TempDir,
    pub store: Arc<CountingStore>,
    pub vault: Arc<Vault>,
    pub client: Arc<EgressClient>,
}

/// A fixture with `allow` as the egress allowlist and the given resolver.
pub async fn fixture_with(allow: &[&str], resolver: Arc<dyn Resolver>, tick: Duration) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    build(dir, allow, resolver, tick, MasterKey::generate(), false).await
}

/// A loopback fixture whose master key is a file and whose vault keeps the anchor file
/// `audit.anchor` next to the database, as the binary's vault does.
pub async fn anchored_fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    key.write_new_file(&dir.path().join("master.key")).unwrap();
    build(
        dir,
        &["127.0.0.1"],
        Arc::new(ScriptedResolver::default()),
        runwarden_vault::MAX_TICK,
        key,
        true,
    )
    .await
}

impl Fixture {
    /// Drops this fixture's store and vault and opens new ones on the same files, as a
    /// restarted process would.
    pub async fn reopen(self) -> Result<Fixture, runwarden_vault::VaultError> {
        self.reopen_after(|| {}).await
    }

    /// Like [`reopen`](Self::reopen), running `between` while nothing has the files open.
    pub async fn reopen_after(
        self,
        between: impl FnOnce(),
    ) -> Result<Fixture, runwarden_vault::VaultError> {
        let Fixture {
            dir,
            store,
            vault,
            client,
        } = self;
        drop((client, vault, store));
        between();
        let key = MasterKey::from_file(&dir.path().join("master.key"))?;
        try_build(
            dir,
            &["127.0.0.1"],
            Arc::new(ScriptedResolver::default()),
            runwarden_vault::MAX_TICK,
            key,
            true,
        )
        .await
    }

    /// The database file.
    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("runwarden.db")
    }

    /// The anchor file (written only by an anchored fixture).
    pub fn anchor_path(&self) -> std::path::PathBuf {
        self.dir.path().join("audit.anchor")
    }
}

async fn build(
    dir: TempDir,
    allow: &[&str],
    resolver: Arc<dyn Resolver>,
    tick: Duration,
    key: MasterKey,
    anchored: bool,
) -> Fixture {
    try_build(dir, allow, resolver, tick, key, anchored)
        .await
        .unwrap()
}

async fn try_build(
    dir: TempDir,
    allow: &[&str],
    resolver: Arc<dyn Resolver>,
    tick: Duration,
    key: MasterKey,
    anchored: bool,
) -> Result<Fixture, runwarden_vault::VaultError> {
    let inner = SqliteStore::open(dir.path().join("runwarden.db"))?;
    let store = Arc::new(CountingStore {
        inner,
        secret_reads: AtomicUsize::new(0),
        audit_batches: AtomicUsize::new(0),
        fail_next: AtomicUsize::new(0),
        appends_left: Default::default(),
    });
    let mut vault = match Vault::open(store.clone(), key, Algorithm::default()).await {
        Ok(vault) => vault,
        Err(error) => {
            // A failed open leaves the files where they are, as on a real disk: a test
            // may go on reading them through a store it still holds. Dropping the
            // TempDir here would delete them under that store.
            let _ = dir.keep();
            return Err(error);
        }
    };
    if anchored {
        vault = vault.with_anchor(dir.path().join("audit.anchor"));
    }
    let vault = Arc::new(vault);
    let config = EgressConfig {
        policy: EgressPolicy::new(allow).unwrap(),
        connect_timeout: Duration::from_secs(5),
        default_timeout: Duration::from_secs(20),
        tick,
        ..EgressConfig::default()
    };
    let client = Arc::new(EgressClient::with_resolver(vault.clone(), config, resolver));
    Ok(Fixture {
        dir,
        store,
        vault,
        client,
    })
}

/// A fixture that allowlists loopback, with the default tick and an empty resolver.
pub async fn fixture() -> Fixture {
    fixture_with(
        &["127.0.0.1"],
        Arc::new(ScriptedResolver::default()),
        runwarden_vault::MAX_TICK,
    )
    .await
}

impl Fixture {
    /// Stores the sigil under `name`.
    pub async fn put_sigil(&self, name: &str) -> SecretName {
        let name = SecretName::new(name).unwrap();
        self.vault
            .secret_put(&name, SecretValue::new(SIGIL.as_bytes().to_vec()))
            .await
            .unwrap();
        name
    }

    /// How many times a secret's ciphertext was read.
    pub fn secret_reads(&self) -> usize {
        self.store.secret_reads.load(Ordering::SeqCst)
    }

    /// Every audit row, oldest first.
    pub async fn audit(&self) -> Vec<AuditRow> {
        self.vault.audit_list(AuditFilter::default()).await.unwrap()
    }

    /// The completion row of the one call the test made that reached the network,
    /// asserting the log holds exactly that call's intent row and its completion naming it
    /// (V7 amended).
    pub async fn completion_row(&self) -> AuditRow {
        let rows = self.audit().await;
        assert_eq!(
            rows.len(),
            2,
            "expected an intent row and a completion row, got {rows:#?}"
        );
        let (intent, completion) = (&rows[0], &rows[1]);
        assert_eq!(
            intent.event.action,
            runwarden_vault::audit::action::HTTP_CALL_STARTED
        );
        assert_eq!(completion.event.intent_id, Some(intent.id), "{rows:#?}");
        rows.into_iter().nth(1).unwrap()
    }

    /// The one audit row the test expects, asserting there is exactly one.
    pub async fn only_audit_row(&self) -> AuditRow {
        let rows = self.audit().await;
        assert_eq!(
            rows.len(),
            1,
            "expected exactly one audit row, got {rows:#?}"
        );
        rows.into_iter().next().unwrap()
    }
}
