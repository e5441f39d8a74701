//! The `Vault`: sealed secrets, master-key rotation and the audit log over one store.

use std::sync::Arc;

use crate::audit::{AuditChain, AuditEvent, AuditRow, VerifyReport};
use crate::envelope::{self, Algorithm};
use crate::error::VaultError;
use crate::master_key::MasterKey;
use crate::secret::{SecretName, SecretValue};
use crate::store::{AuditFilter, SealedKind, SealedMeta, StoreError, VaultStore};

/// The name of the vault's own audit key among the internal records.
const AUDIT_KEY: &str = "audit-chain";

/// Secrets at rest and the audit log (SPEC V1, V2, V7).
///
/// There is deliberately no method that returns a secret's plaintext to a caller: callers
/// name a secret and [`EgressClient`](crate::EgressClient) places it at the wire ("use").
/// Reading a value back ("reveal") is a different permission that nothing grants yet.
pub struct Vault {
    store: Arc<dyn VaultStore>,
    master: MasterKey,
    algorithm: Algorithm,
    chain: Arc<AuditChain>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault")
            .field("master", &self.master)
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Vault {
    /// Opens the vault over a store. The first open creates the audit key; every later open
    /// checks that `master` opens it, so a wrong key fails here rather than mid-call.
    pub async fn open(
        store: Arc<dyn VaultStore>,
        master: MasterKey,
        algorithm: Algorithm,
    ) -> Result<Self, VaultError> {
        let audit_key = match store.sealed_get(SealedKind::Internal, AUDIT_KEY).await? {
            Some(record) => envelope::open(&master, &record)?,
            None => {
                let fresh = MasterKey::generate();
                let record = envelope::seal(
                    &master,
                    algorithm,
                    SealedKind::Internal,
                    AUDIT_KEY,
                    fresh.bytes(),
                    now_ms(),
                );
                // Two processes may open a fresh store at once: whoever inserts first wins
                // and both read the winner's key back.
                store.sealed_insert_new(record).await?;
                let record = store
                    .sealed_get(SealedKind::Internal, AUDIT_KEY)
                    .await?
                    .ok_or_else(|| {
                        StoreError::new("creating the audit key", "the key vanished after insert")
                    })?;
                envelope::open(&master, &record)?
            }
        };
        let chain = Arc::new(AuditChain::from_audit_key(&audit_key));
        Ok(Self {
            store,
            master,
            algorithm,
            chain,
        })
    }

    /// The fingerprint of the loaded master key.
    pub fn master_key_id(&self) -> &str {
        self.master.id()
    }

    /// Seals and stores a secret, replacing any value under that name.
    pub async fn secret_put(
        &self,
        name: &SecretName,
        value: SecretValue,
    ) -> Result<(), VaultError> {
        if value.is_empty() {
            return Err(VaultError::EmptySecret {
                name: name.to_string(),
            });
        }
        let record = envelope::seal(
            &self.master,
            self.algorithm,
            SealedKind::Secret,
            name.as_str(),
            value.expose(),
            now_ms(),
        );
        Ok(self.store.sealed_put(record).await?)
    }

    /// Names and times of every secret; never a value.
    pub async fn secret_list(&self) -> Result<Vec<SealedMeta>, VaultError> {
        Ok(self.store.sealed_list(SealedKind::Secret).await?)
    }

    /// True when a secret of that name is stored. Reads no plaintext.
    pub async fn secret_exists(&self, name: &SecretName) -> Result<bool, VaultError> {
        Ok(self
            .store
            .sealed_get(SealedKind::Secret, name.as_str())
            .await?
            .is_some())
    }

    /// Removes a secret; answers whether it existed.
    pub async fn secret_remove(&self, name: &SecretName) -> Result<bool, VaultError> {
        Ok(self
            .store
            .sealed_delete(SealedKind::Secret, name.as_str())
            .await?)
    }

    /// Opens a secret for placement at the wire. Crate-private: this is "use", not "reveal".
    pub(crate) async fn secret_use(&self, name: &SecretName) -> Result<SecretValue, VaultError> {
        let record = self
            .store
            .sealed_get(SealedKind::Secret, name.as_str())
            .await?
            .ok_or_else(|| VaultError::SecretNotFound {
                name: name.to_string(),
            })?;
        let mut plaintext = envelope::open(&self.master, &record)?;
        Ok(SecretValue::new(std::mem::take(&mut *plaintext)))
    }

    /// Re-wraps every data key (secrets and the audit key) from the loaded master key to
    /// `new`, in one store transaction: an interruption leaves every record under exactly
    /// one of the two keys. This `Vault` still holds the old key: open a new one after.
    pub async fn rotate_master_key(&self, new: &MasterKey) -> Result<usize, VaultError> {
        // The closure must be 'static and Send, so it carries its own copies of both keys.
        let (old, new) = (self.master.duplicate(), new.duplicate());
        let count = self
            .store
            .sealed_rewrap_all(Box::new(move |record| {
                envelope::rewrap(&old, &new, record)
                    .map_err(|e| StoreError::new("re-wrapping a data key", e))
            }))
            .await?;
        Ok(count)
    }

    /// Appends one row to the audit log.
    pub async fn audit_record(&self, event: AuditEvent) -> Result<AuditRow, VaultError> {
        Ok(self.store.audit_append(event, self.chain.clone()).await?)
    }

    /// Audit rows matching a filter.
    pub async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, VaultError> {
        Ok(self.store.audit_list(filter).await?)
    }

    /// Walks the whole chain and reports the first bad row, if any.
    pub async fn audit_verify(&self) -> Result<VerifyReport, VaultError> {
        Ok(self.chain.verify(&*self.store).await?)
    }
}
