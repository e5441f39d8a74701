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
use runwarden_testkit::{Call, Detail, Hook, HookedStore, StoreAnswer, Strike};
use runwarden_vault::store::{AuditFilter, SealedKind, StoreError};
use runwarden_vault::{
    Algorithm, AuditRow, EgressClient, EgressConfig, EgressPolicy, MasterKey, Resolver, SecretName,
    SecretValue, Vault,
};
use tempfile::TempDir;

/// The value every test secret carries; it must never surface anywhere but the wire.
pub const SIGIL: &str = "sigil-7c1f9e2a-never-print";

/// A real SQLite store behind [`Counting`].
pub type CountingStore = HookedStore<SqliteStore, Counting>;

/// Counts how often a secret's ciphertext is read and how many audit transactions ran,
/// and makes audit appends fail on demand (a store fault we cannot cause on demand for
/// real without failing every other read too).
#[derive(Default)]
pub struct Counting {
    pub secret_reads: AtomicUsize,
    /// Audit transactions (`audit_append` and `audit_append_many` calls) that committed.
    pub audit_batches: AtomicUsize,
    /// Reads of audit rows (`audit_list` calls).
    pub audit_reads: AtomicUsize,
    /// The next this many audit appends fail, as a locked or full database would.
    pub fail_next: AtomicUsize,
    /// When set, every audit append after the next N ones fails (N counts down).
    pub appends_left: std::sync::Mutex<Option<usize>>,
}

impl Counting {
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

fn is_audit_append(call: &Call) -> bool {
    matches!(call.method, "audit_append" | "audit_append_many")
}

#[async_trait]
impl Hook for Counting {
    async fn before(&self, call: &Call) -> Strike {
        if call.detail == Detail::Sealed(SealedKind::Secret) {
            self.secret_reads.fetch_add(1, Ordering::SeqCst);
        }
        if call.method == "audit_list" {
            self.audit_reads.fetch_add(1, Ordering::SeqCst);
        }
        if is_audit_append(call)
            && let Err(error) = self.append_allowed()
        {
            return Strike::Fail(error);
        }
        Strike::Pass
    }

    async fn after(&self, call: &Call, answer: StoreAnswer<'_>) -> Option<StoreError> {
        if is_audit_append(call) && answer.ok {
            self.audit_batches.fetch_add(1, Ordering::SeqCst);
        }
        None
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
    let store = Arc::new(HookedStore::new(Arc::new(inner), Counting::default()));
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

/// Collects everything the tracing subscriber writes.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
