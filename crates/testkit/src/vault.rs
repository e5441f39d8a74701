//! A vault over a fresh SQLite file, with an egress client that admits 127.0.0.1: what
//! every test that makes a real outbound call needs.

use std::sync::Arc;

use runwarden_store_sqlite::{Durability, SqliteStore};
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{
    Algorithm, AuditRow, EgressClient, EgressConfig, EgressPolicy, MasterKey, SecretName,
    SecretValue, Vault,
};

/// The parts; the temporary directory (and the database in it) lives as long as this.
pub struct LoopbackVault {
    /// Holds `runwarden.db`.
    pub dir: tempfile::TempDir,
    /// The store the vault uses (also a run, queue and catalogue store).
    pub store: SqliteStore,
    /// The vault, with a fresh master key.
    pub vault: Arc<Vault>,
    /// The guarded egress client; its allowlist admits 127.0.0.1 only.
    pub egress: Arc<EgressClient>,
}

/// A vault over a fresh SQLite file, with the anchor file `audit.anchor` beside it, and an
/// egress client admitting loopback.
pub async fn loopback_vault() -> LoopbackVault {
    loopback_vault_with(Durability::PowerCut).await
}

/// [`loopback_vault`] on a store opened with `durability`.
pub async fn loopback_vault_with(durability: Durability) -> LoopbackVault {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("runwarden.db"))
        .expect("a fresh SQLite file")
        .with_durability(durability);
    let vault = Vault::open(
        Arc::new(store.clone()),
        MasterKey::generate(),
        Algorithm::default(),
    )
    .await
    .expect("a fresh vault")
    // As the binary's vault: every committed batch moves the anchor file too.
    .with_anchor(dir.path().join("audit.anchor"));
    let vault = Arc::new(vault);
    let config = EgressConfig {
        policy: EgressPolicy::new(&["127.0.0.1"]).expect("a valid allowlist"),
        ..EgressConfig::default()
    };
    let egress = Arc::new(EgressClient::new(vault.clone(), config));
    LoopbackVault {
        dir,
        store,
        vault,
        egress,
    }
}

impl LoopbackVault {
    /// Every audit row, oldest first.
    pub async fn audit(&self) -> Vec<AuditRow> {
        self.vault
            .audit_list(AuditFilter::default())
            .await
            .expect("the audit log reads")
    }

    /// The outcome action of every call, oldest first; each intent row is checked to be
    /// completed and left out (see [`call_outcomes`]).
    pub async fn audit_actions(&self) -> Vec<String> {
        call_outcomes(&self.audit().await)
    }

    /// Stores `value` under `name` and names it.
    pub async fn put_secret(&self, name: &str, value: &str) -> SecretName {
        let name = SecretName::new(name).expect("a valid secret name");
        self.vault
            .secret_put(&name, SecretValue::new(value.as_bytes().to_vec()))
            .await
            .expect("the secret is stored");
        name
    }
}

/// The outcome action of every call in `rows` (oldest first), with the intent rows
/// (`http_call_started`) left out after checking that each is completed by exactly one
/// later row naming it (V7 amended). Tests that count calls by their outcome use this.
pub fn call_outcomes(rows: &[AuditRow]) -> Vec<String> {
    use runwarden_vault::audit::action;
    for intent in rows
        .iter()
        .filter(|r| r.event.action == action::HTTP_CALL_STARTED)
    {
        let completions: Vec<i64> = rows
            .iter()
            .filter(|r| r.event.intent_id == Some(intent.id))
            .map(|r| r.id)
            .collect();
        assert!(
            completions.len() == 1 && completions[0] > intent.id,
            "intent row {} is completed by rows {completions:?}",
            intent.id
        );
    }
    rows.iter()
        .filter(|r| r.event.action != action::HTTP_CALL_STARTED)
        .map(|r| r.event.action.clone())
        .collect()
}
