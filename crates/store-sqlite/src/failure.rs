//! The store's internal failure type, turned into a `StoreError` at the blocking boundary.

use runwarden_vault::store::StoreError;

/// Why a blocking store call failed, before the operation name is attached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// SQLite refused or failed the statement.
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    /// A stored value cannot be what this build wrote.
    #[error("{0}: the database is corrupt, restore it from a backup")]
    Corrupt(String),
    /// An error that already names its operation (from a rewrap closure or the migrator).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Failure {
    /// Attaches the operation, passing an existing `StoreError` through unchanged.
    pub(crate) fn into_store_error(self, operation: &str) -> StoreError {
        match self {
            Self::Store(error) => error,
            other => StoreError::new(operation, other),
        }
    }
}

/// Reads a 32-byte hash column, refusing any other length rather than panicking.
pub(crate) fn hash32(bytes: Vec<u8>, what: &str) -> Result<[u8; 32], Failure> {
    let len = bytes.len();
    bytes
        .try_into()
        .map_err(|_| Failure::Corrupt(format!("{what} holds {len} bytes instead of 32")))
}
