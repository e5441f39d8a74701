//! The `Vault`: sealed secrets, master-key rotation and the audit log over one store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::audit::{AuditChain, AuditEvent, AuditRow};
use crate::audit_writer::{AnchorDue, AuditWriter};
use crate::envelope::{self, Algorithm};
use crate::error::VaultError;
use crate::master_key::MasterKey;
use crate::matcher::SecretMatcher;
use crate::secret::{SecretName, SecretValue};
use crate::secret_index::SecretIndex;
use crate::store::{AuditFilter, SealedKind, SealedMeta, StoreError, VaultStore};
use crate::witness::Witness;

/// The name of the vault's own audit key among the internal records.
const AUDIT_KEY: &str = "audit-chain";
/// An internal record written with the audit key and never removed: should the key go
/// missing, this record (or any other sealed record) says it existed, so no new key is
/// made over the loss.
const AUDIT_KEY_MADE: &str = "audit-chain-made";

/// Secrets at rest and the audit log (V1, V2, V7).
///
/// Callers name a secret and [`EgressClient`](crate::EgressClient) places it at the wire
/// ("use"). The one exception is the OAuth client, the layer right above the vault, which
/// opens a client secret or key itself ([`secret_use`](Self::secret_use)) to authenticate
/// at a token endpoint; an architecture test keeps every other crate off it. Reading a
/// value back for a person ("reveal") is a different permission that nothing grants yet.
pub struct Vault {
    pub(crate) store: Arc<dyn VaultStore>,
    master: MasterKey,
    algorithm: Algorithm,
    pub(crate) chain: Arc<AuditChain>,
    pub(crate) writer: AuditWriter,
    /// This open created the audit key: the store was new to the vault.
    pub(crate) fresh_key: bool,
    secrets: SecretIndex,
    /// The DPoP nonces servers gave this process (RFC 9449), by origin.
    pub(crate) dpop_nonces: crate::dpop::Nonces,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault")
            .field("master", &self.master)
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

pub(crate) use runwarden_base::now_ms;

impl Vault {
    /// Opens the vault over a store. The first open of an empty log creates the audit key;
    /// every later open checks that `master` opens it, so a wrong key fails here rather
    /// than mid-call. A missing key while the log holds rows, or beside any other sealed
    /// record (the record written with the key, a secret), is
    /// [`VaultError::AuditKeyMissing`]: nothing recreates it (V7 amended).
    pub async fn open(
        store: Arc<dyn VaultStore>,
        master: MasterKey,
        algorithm: Algorithm,
    ) -> Result<Self, VaultError> {
        let mut fresh_key = false;
        let audit_key = match store.sealed_get(SealedKind::Internal, AUDIT_KEY).await? {
            Some(record) => envelope::open(&master, &record)?,
            None => {
                // V7 (amended): a new key over existing rows would hide their loss.
                let rows = audit_rows(&*store).await?;
                if rows > 0 {
                    return Err(VaultError::AuditKeyMissing { rows });
                }
                // Nor over an installation that had one: wiping the rows and the key
                // together leaves the other records behind.
                if let Some(evidence) = key_evidence(&*store).await? {
                    return Err(VaultError::AuditKeyGone { evidence });
                }
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
                fresh_key = store.sealed_insert_new(record).await?;
                let record = store
                    .sealed_get(SealedKind::Internal, AUDIT_KEY)
                    .await?
                    .ok_or_else(|| {
                        StoreError::new("creating the audit key", "the key vanished after insert")
                    })?;
                envelope::open(&master, &record)?
            }
        };
        // Written with the key (and by the first open of an older installation): the
        // evidence that a key existed, should it go missing. Read first, so a command that
        // only reads never needs the write lock; a failed write is tried again next open.
        if store
            .sealed_get(SealedKind::Internal, AUDIT_KEY_MADE)
            .await?
            .is_none()
        {
            let made = envelope::seal(
                &master,
                algorithm,
                SealedKind::Internal,
                AUDIT_KEY_MADE,
                &now_ms().to_be_bytes(),
                now_ms(),
            );
            if let Err(error) = store.sealed_insert_new(made).await {
                tracing::debug!(%error, "could not record the audit key's making yet");
            }
        }
        let chain = Arc::new(AuditChain::from_audit_key(&audit_key));
        let writer = AuditWriter::new(store.clone(), chain.clone(), fresh_key);
        Ok(Self {
            store,
            master,
            algorithm,
            chain,
            writer,
            fresh_key,
            secrets: SecretIndex::default(),
            dpop_nonces: Default::default(),
        })
    }

    /// Keeps the audit log's witness in the anchor file at `path` (V7 amended): every
    /// committed batch moves it, and [`audit_verify`](Self::audit_verify) checks the log
    /// against it. Without one (unit tests), no file is written and verify skips it.
    pub fn with_anchor(mut self, path: impl Into<PathBuf>) -> Self {
        self.writer.set_witness(Witness::new(path));
        self
    }

    /// The anchor file, when one is configured.
    pub fn anchor_path(&self) -> Option<&Path> {
        self.writer.witness().map(Witness::path)
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
        let put = self.store.sealed_put(record).await;
        self.secrets.invalidate();
        Ok(put?)
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
        let removed = self
            .store
            .sealed_delete(SealedKind::Secret, name.as_str())
            .await;
        self.secrets.invalidate();
        Ok(removed?)
    }

    /// The matcher over every stored secret (for the scrubber and the exfiltration
    /// check), rebuilt when the secrets' version moved since it was built, here or in
    /// another process (the freshness rule is on [`SecretIndex`]). Costs one small read,
    /// shared by concurrent callers, when nothing changed.
    pub(crate) async fn secret_matcher(&self) -> Result<Arc<SecretMatcher>, VaultError> {
        let version = self
            .secrets
            .version(|| self.store.sealed_secrets_version())
            .await?;
        if let Some(matcher) = self.secrets.current(version) {
            return Ok(matcher);
        }
        let _one = self.secrets.rebuild_lock().await;
        if let Some(matcher) = self.secrets.current(version) {
            return Ok(matcher);
        }
        // Read after the version: whatever changes meanwhile moves the version again, and
        // the next call rebuilds.
        let list = self.store.sealed_list(SealedKind::Secret).await?;
        let mut values = Vec::with_capacity(list.len());
        for meta in &list {
            // A secret removed between the list and this read is simply not searched for.
            if let Some(record) = self
                .store
                .sealed_get(SealedKind::Secret, &meta.name)
                .await?
            {
                // A record that does not open (altered, or under another key) cannot be
                // placed either; it must not stop every other call. Its own use fails.
                match envelope::open(&self.master, &record) {
                    Ok(value) => values.push((meta.name.clone(), value)),
                    Err(e) => tracing::warn!(
                        secret = %meta.name,
                        error = %e,
                        "a stored secret that does not open is not searched for"
                    ),
                }
            }
        }
        let matcher = Arc::new(SecretMatcher::new(
            values
                .iter()
                .map(|(name, value)| (name.clone(), value.as_slice())),
        ));
        self.secrets.store(version, matcher.clone());
        Ok(matcher)
    }

    /// Opens a secret for use by the vault's own layer: the egress client places it at the
    /// wire, and the OAuth client (`runwarden-oauth`, the crate right above the vault)
    /// authenticates at a token endpoint with a client secret or signs a client assertion
    /// with a private key. This is "use", not "reveal": nothing hands the value to an agent,
    /// a log or an answer, and no other crate calls it.
    pub async fn secret_use(&self, name: &SecretName) -> Result<SecretValue, VaultError> {
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

    /// Seals a record the vault keeps for itself (OAuth tokens and registrations, M18):
    /// never listed by `secret list`, rewrapped with every other record on rotation.
    pub async fn internal_put(&self, name: &str, value: &[u8]) -> Result<(), VaultError> {
        let record = envelope::seal(
            &self.master,
            self.algorithm,
            SealedKind::Internal,
            name,
            value,
            now_ms(),
        );
        Ok(self.store.sealed_put(record).await?)
    }

    /// Opens a record the vault keeps for itself, if present.
    pub async fn internal_get(
        &self,
        name: &str,
    ) -> Result<Option<zeroize::Zeroizing<Vec<u8>>>, VaultError> {
        match self.store.sealed_get(SealedKind::Internal, name).await? {
            Some(record) => Ok(Some(envelope::open(&self.master, &record)?)),
            None => Ok(None),
        }
    }

    /// Removes a record the vault keeps for itself; answers whether it existed.
    pub async fn internal_delete(&self, name: &str) -> Result<bool, VaultError> {
        Ok(self.store.sealed_delete(SealedKind::Internal, name).await?)
    }

    /// The cross-process refresh lease of a token record: true when `holder` has it
    /// for `ttl_ms` from now.
    pub async fn oauth_lease_acquire(
        &self,
        key: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<bool, VaultError> {
        let now = now_ms();
        Ok(self
            .store
            .oauth_lease_acquire(key, holder, now, now + ttl_ms)
            .await?)
    }

    /// Gives a refresh lease back.
    pub async fn oauth_lease_release(&self, key: &str, holder: &str) -> Result<(), VaultError> {
        Ok(self.store.oauth_lease_release(key, holder).await?)
    }

    /// The DPoP nonces servers gave this process (RFC 9449), by origin: the egress client
    /// remembers the MCP servers', the OAuth client the token endpoints'.
    pub fn dpop_nonces(&self) -> &crate::dpop::Nonces {
        &self.dpop_nonces
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
            .await;
        self.secrets.invalidate();
        Ok(count?)
    }

    /// Appends one row to the audit log and answers once it is committed.
    /// Concurrent callers share one transaction (group commit); a failed batch fails every
    /// caller in it.
    pub async fn audit_record(&self, event: AuditEvent) -> Result<AuditRow, VaultError> {
        self.writer.append(event).await
    }

    /// [`audit_record`](Self::audit_record), answering once the row is committed; the
    /// anchor write it leaves, if any, is the caller's to finish (see
    /// [`AuditWriter::append_then_anchor`]).
    pub(crate) async fn audit_record_then_anchor(
        &self,
        event: AuditEvent,
    ) -> Result<(AuditRow, Option<AnchorDue<'_>>), VaultError> {
        self.writer.append_then_anchor(event).await
    }

    /// Of these intent rows, those with no completion row (calls whose outcome was never
    /// recorded).
    pub async fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Result<Vec<i64>, VaultError> {
        Ok(self.store.audit_incomplete(intent_ids).await?)
    }

    /// Audit rows matching a filter.
    pub async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, VaultError> {
        Ok(self.store.audit_list(filter).await?)
    }
}

/// What says an audit key existed in this store although none is there now: any sealed
/// record (the record written with the key, a secret, an OAuth token).
async fn key_evidence(store: &dyn VaultStore) -> Result<Option<String>, StoreError> {
    let internal = store.sealed_list(SealedKind::Internal).await?;
    if internal.iter().any(|r| r.name == AUDIT_KEY_MADE) {
        return Ok(Some("recorded making one".into()));
    }
    let secrets = store.sealed_list(SealedKind::Secret).await?;
    Ok(match (internal.len(), secrets.len()) {
        (0, 0) => None,
        (_, 0) => Some("holds other internal records".into()),
        (_, 1) => Some("holds 1 stored secret".into()),
        (_, n) => Some(format!("holds {n} stored secrets")),
    })
}

/// How many rows the log holds: the tip's id, or the newest row's id should the tip be
/// gone too.
pub(crate) async fn audit_rows(store: &dyn VaultStore) -> Result<i64, StoreError> {
    let tip = store.audit_tip().await?.map_or(0, |t| t.last_id);
    let newest = store
        .audit_list(AuditFilter {
            newest_first: true,
            limit: 1,
            ..AuditFilter::default()
        })
        .await?
        .first()
        .map_or(0, |r| r.id);
    Ok(tip.max(newest))
}
