//! The store error every crate uses, and its kinds. A backend classifies each fault so
//! a caller can tell whether a retry can help.

use std::sync::atomic::{AtomicU64, Ordering};

/// A store failure. The message names the operation and never carries a secret.
#[derive(Debug, Clone, thiserror::Error)]
#[error("store error while {operation}: {message}")]
pub struct StoreError {
    /// What the store was doing ("appending an audit row").
    pub operation: String,
    /// What went wrong, in the backend's words, with what to do about it.
    pub message: String,
    /// What kind of fault it is: decides whether a retry can help.
    pub fault: StoreFault,
}

/// The kind of a store fault, as a backend classifies it. Callers decide with it whether
/// to retry (a queued run is requeued, the API answers 503) or to give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFault {
    /// Another connection or process holds the lock the call needed (SQLite `BUSY` or
    /// `LOCKED`); it heals when that transaction ends.
    Busy,
    /// The database (or its directory) cannot be written: wrong permissions or a
    /// read-only file system. It heals when the operator fixes the permissions.
    ReadOnly,
    /// The disk (or a quota) is full; it heals when space is freed.
    DiskFull,
    /// The process or the system ran out of file descriptors (`EMFILE`, `ENFILE`); it
    /// heals when connections close.
    TooManyFiles,
    /// An input/output error reading or writing the file; often transient.
    Io,
    /// The file is damaged or is not a database. Retrying cannot help: restore a backup.
    Corrupt,
    /// Anything else: a constraint, a bug, a value this build did not write.
    Other,
}

/// Every kind, in a fixed order (for metrics).
pub const STORE_FAULTS: [StoreFault; 7] = [
    StoreFault::Busy,
    StoreFault::ReadOnly,
    StoreFault::DiskFull,
    StoreFault::TooManyFiles,
    StoreFault::Io,
    StoreFault::Corrupt,
    StoreFault::Other,
];

/// Store errors this process has built so far, per kind, in [`STORE_FAULTS`] order. Every
/// `StoreError` is built by [`StoreError::with_fault`], which counts it here; the process's
/// `/metrics` reports these as `runwarden_store_errors_total{kind}` (O5: per process).
static FAULTS_SEEN: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// How many store errors of each kind this process has seen, in [`STORE_FAULTS`] order.
pub fn store_errors_seen() -> [(StoreFault, u64); 7] {
    STORE_FAULTS.map(|fault| (fault, FAULTS_SEEN[fault.index()].load(Ordering::Relaxed)))
}

impl StoreFault {
    fn index(self) -> usize {
        STORE_FAULTS
            .iter()
            .position(|f| *f == self)
            .unwrap_or(STORE_FAULTS.len() - 1)
    }

    /// The stable lowercase name of the kind (for logs and metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Busy => "busy",
            Self::ReadOnly => "read_only",
            Self::DiskFull => "disk_full",
            Self::TooManyFiles => "too_many_files",
            Self::Io => "io",
            Self::Corrupt => "corrupt",
            Self::Other => "other",
        }
    }
}

impl StoreError {
    /// Builds an error of kind [`StoreFault::Other`] from an operation and anything
    /// printable.
    pub fn new(operation: impl Into<String>, message: impl ToString) -> Self {
        Self::with_fault(operation, StoreFault::Other, message)
    }

    /// Builds an error of a given kind.
    pub fn with_fault(
        operation: impl Into<String>,
        fault: StoreFault,
        message: impl ToString,
    ) -> Self {
        FAULTS_SEEN[fault.index()].fetch_add(1, Ordering::Relaxed);
        Self {
            operation: operation.into(),
            message: message.to_string(),
            fault,
        }
    }

    /// True when the same call may succeed later without anyone changing the data: a lock
    /// held elsewhere, a full disk, too many open files, an I/O fault, or a read-only file
    /// whose permissions the operator can fix. A corrupt database and every other fault
    /// are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.fault,
            StoreFault::Busy
                | StoreFault::ReadOnly
                | StoreFault::DiskFull
                | StoreFault::TooManyFiles
                | StoreFault::Io
        )
    }

    /// True when the store itself is unavailable (as opposed to refusing this call's
    /// data): every retryable fault and a corrupt database. The API answers these with
    /// 503 `store_unavailable`.
    pub fn is_unavailable(&self) -> bool {
        self.is_retryable() || self.fault == StoreFault::Corrupt
    }
}
