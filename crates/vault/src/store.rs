//! The vault's storage seam: sealed records and the audit log, implemented by store crates.
//!
//! This is an internal seam, not a plugin API. Every backend runs the conformance suite in
//! `runwarden-storetest`, and the vault relies on exactly what that suite checks.
//!
//! The store error (from the base crate) and the token store (beside the tokens, so they
//! need not import the seam) are named here too, so a backend finds the seam in one place.

use std::sync::Arc;

use async_trait::async_trait;

use crate::audit::{AuditChain, AuditEvent, AuditRow, AuditTip};
pub use crate::tokens::TokenStore;
pub use runwarden_base::{StoreError, StoreFault};

/// Which table of sealed records a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealedKind {
    /// An operator's secret, listed by `secret list`.
    Secret,
    /// A key the vault keeps for itself (the audit chain key), never listed.
    Internal,
}

impl SealedKind {
    /// The stable text stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Secret => "secret",
            Self::Internal => "internal",
        }
    }
}

/// One envelope-encrypted record as stored (V1). Holds ciphertext only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedRecord {
    /// Which table it belongs to.
    pub kind: SealedKind,
    /// The identifier, also the associated data of both layers.
    pub name: String,
    /// The AEAD used for both layers, as stored ("xchacha20poly1305", "aes256gcm").
    pub algorithm: String,
    /// The envelope format version.
    pub version: u32,
    /// Fingerprint of the master key that wrapped the data key.
    pub master_key_id: String,
    /// Nonce for the wrapped data key.
    pub key_nonce: Vec<u8>,
    /// The data key sealed with the master key.
    pub wrapped_key: Vec<u8>,
    /// Nonce for the value.
    pub value_nonce: Vec<u8>,
    /// The value sealed with the data key.
    pub ciphertext: Vec<u8>,
    /// Creation time, Unix milliseconds UTC.
    pub created_ms: i64,
    /// Last update time, Unix milliseconds UTC.
    pub updated_ms: i64,
}

/// What `secret list` shows: never a value, never ciphertext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedMeta {
    /// The identifier.
    pub name: String,
    /// The AEAD it is sealed with.
    pub algorithm: String,
    /// Creation time, Unix milliseconds UTC.
    pub created_ms: i64,
    /// Last update time, Unix milliseconds UTC.
    pub updated_ms: i64,
}

/// Rewraps one record during master-key rotation; an error aborts the whole rotation.
pub type RewrapFn = Box<dyn FnMut(SealedRecord) -> Result<SealedRecord, StoreError> + Send>;

/// Which audit rows to return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only rows with this action.
    pub action: Option<String>,
    /// Only rows with this correlation (run id).
    pub correlation: Option<String>,
    /// Only rows with an id greater than this.
    pub after_id: Option<i64>,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
    /// At most this many rows.
    pub limit: u32,
}

/// Storage for sealed records and the audit log.
#[async_trait]
pub trait VaultStore: Send + Sync + 'static {
    /// One sealed record, if present.
    async fn sealed_get(
        &self,
        kind: SealedKind,
        name: &str,
    ) -> Result<Option<SealedRecord>, StoreError>;

    /// Inserts or replaces a record. On replace, `created_ms` of the existing row is kept.
    async fn sealed_put(&self, record: SealedRecord) -> Result<(), StoreError>;

    /// Inserts a record only if none has its kind and name; answers whether it inserted.
    async fn sealed_insert_new(&self, record: SealedRecord) -> Result<bool, StoreError>;

    /// Deletes a record; answers whether one existed.
    async fn sealed_delete(&self, kind: SealedKind, name: &str) -> Result<bool, StoreError>;

    /// Metadata of every record of a kind, ordered by name.
    async fn sealed_list(&self, kind: SealedKind) -> Result<Vec<SealedMeta>, StoreError>;

    /// The secrets' version: a number that changes whenever an operator's secret is
    /// stored, replaced, removed or rewrapped, committed in the same transaction as the
    /// change (by any process on the store), and never changed by anything else. The
    /// vault reads it before every guarded call to learn whether its matcher over the
    /// secrets is still current, so it must be cheap and must not wait for a writer: a
    /// backend reads one row (on SQLite from a read-only WAL connection, outside the
    /// write gate). The answer reflects every change committed before the read began.
    ///
    /// The default reads the list of secrets and answers its fingerprint: correct, but
    /// one list read per call, through whatever queue the backend's reads take.
    async fn sealed_secrets_version(&self) -> Result<u64, StoreError> {
        let list = self.sealed_list(SealedKind::Secret).await?;
        Ok(list_fingerprint(&list))
    }

    /// Runs `rewrap` over every record of every kind in one transaction and stores the
    /// results; any error leaves every record as it was. Answers how many were rewrapped.
    async fn sealed_rewrap_all(&self, rewrap: RewrapFn) -> Result<usize, StoreError>;

    /// Appends one audit row atomically: reads the tip, assigns the next id (the previous
    /// id plus one, starting at 1), links the row with `chain`, stores it and moves the tip
    /// anchor, all in one transaction that other writers (other processes too) wait for.
    async fn audit_append(
        &self,
        event: AuditEvent,
        chain: Arc<AuditChain>,
    ) -> Result<AuditRow, StoreError>;

    /// Appends several rows in one transaction (group commit): the same rules as
    /// [`audit_append`](Self::audit_append) for each row, in order, with contiguous ids and
    /// one move of the tip anchor. All or nothing: an error leaves the log as it was. An
    /// empty batch writes nothing and answers an empty list.
    ///
    /// A batch holding a row that [`must_sync`](crate::AuditEvent::must_sync) is on disk
    /// when this answers; any other batch is committed, so it survives a killed process,
    /// and reaches the disk no later than the next synced batch.
    async fn audit_append_many(
        &self,
        events: Vec<AuditEvent>,
        chain: Arc<AuditChain>,
    ) -> Result<Vec<AuditRow>, StoreError>;

    /// Of the given intent rows' ids, those that no row names in its `intent_id` (calls
    /// whose outcome was never recorded), in ascending order.
    async fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Result<Vec<i64>, StoreError>;

    /// Rows matching a filter.
    async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, StoreError>;

    /// The tip anchor, if any row was ever appended.
    async fn audit_tip(&self) -> Result<Option<AuditTip>, StoreError>;

    /// How many rows the log holds with each action, ordered by action, for metrics: the
    /// counts the store keeps beside the log, and the rows appended after the last one
    /// folded into them (an action whose rows were all removed reads 0). Fold first, so
    /// the rows after it are few: this reads every one of them.
    async fn audit_counts(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// Adds up to `most` of the audit rows after the last one folded into the counts
    /// [`audit_counts`](Self::audit_counts) reads, in one transaction, and answers how many
    /// it added: 0 once no row is left after the last one folded. A log that no longer
    /// holds the last row folded (wiped, restored from another copy) is counted again from
    /// its start. Appends never touch the counts; this is what keeps them up to date.
    async fn audit_counts_fold(&self, most: u64) -> Result<u64, StoreError>;

    /// M18: takes the refresh lease of an OAuth token (`key`) for `holder` until
    /// `expires_ms`, if no other holder has it unexpired at `now_ms`; answers whether this
    /// holder has it now (a holder that already has it extends it). One row per key, one
    /// statement: processes on one database refresh a token one at a time.
    async fn oauth_lease_acquire(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<bool, StoreError>;

    /// M18: gives the lease back if `holder` still has it; a lease another holder took
    /// after this one's expired is left alone.
    async fn oauth_lease_release(&self, key: &str, holder: &str) -> Result<(), StoreError>;
}

/// A number that differs for two lists of secrets that differ in any name, algorithm or
/// time (never a value): the default [`VaultStore::sealed_secrets_version`]. Two changes
/// within one millisecond that leave every name and algorithm as they were look alike to
/// it; a backend's own version does not.
fn list_fingerprint(list: &[SealedMeta]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    list.len().hash(&mut hasher);
    for meta in list {
        meta.name.hash(&mut hasher);
        meta.algorithm.hash(&mut hasher);
        meta.created_ms.hash(&mut hasher);
        meta.updated_ms.hash(&mut hasher);
    }
    hasher.finish()
}

/// The most audit rows one transaction folds into their counts: about 2 ms of counting on
/// SQLite, where it holds the write lock, so the calls beside a fold barely wait.
const FOLD_AT_MOST: u64 = 20_000;

/// The audit rows by action, ordered by action, as metrics report them: the rows appended
/// since the last fold are folded into the counts the store keeps (a few transactions of
/// at most [`FOLD_AT_MOST`] rows each), then the counts are read. A caller abandoned part
/// way keeps what it folded, so the next one starts from there. A fold that fails (a full
/// disk, a database that refuses writes) leaves its rows to the read, which counts them
/// all the same: the figures stay right when metrics matter most.
pub async fn audit_rows_by_action(
    store: &dyn VaultStore,
) -> Result<Vec<(String, u64)>, StoreError> {
    loop {
        match store.audit_counts_fold(FOLD_AT_MOST).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "audit rows left unfolded; the read counts them");
                break;
            }
        }
    }
    store.audit_counts().await
}
