//! The store's internal failure type, turned into a `StoreError` where the operation is
//! known, and the classification of PostgreSQL's faults into [`StoreFault`]s whose
//! messages say what to do.

use std::error::Error as _;

use runwarden_vault::store::{StoreError, StoreFault};
use tokio_postgres::error::SqlState;

/// Why a store call failed, before the operation name is attached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The server refused or failed the statement, or the connection broke.
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
    /// No pooled connection could be had.
    #[error(transparent)]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A stored value cannot be what this build wrote.
    #[error("{0}")]
    Corrupt(String),
    /// An error that already names its operation (a rewrap closure, a refused input).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Failure {
    /// Attaches the operation, passing an existing `StoreError` through unchanged, and
    /// names the fault.
    pub(crate) fn into_store_error(self, operation: &str) -> StoreError {
        match self {
            Self::Store(error) => error,
            Self::Corrupt(problem) => StoreError::with_fault(
                operation,
                StoreFault::Corrupt,
                format!("{problem}: the database is corrupt, restore it from a backup"),
            ),
            Self::Sql(error) => {
                let fault = classify(&error);
                StoreError::with_fault(operation, fault, described(&driver_words(&error), fault))
            }
            Self::Pool(error) => {
                let fault = classify_pool(&error);
                StoreError::with_fault(operation, fault, described(&error.to_string(), fault))
            }
        }
    }
}

/// The fault behind a pool error: a wait that timed out is retryable like a refused
/// connection.
fn classify_pool(error: &deadpool_postgres::PoolError) -> StoreFault {
    use deadpool_postgres::PoolError;
    match error {
        PoolError::Timeout(_) => StoreFault::Io,
        PoolError::Backend(error) => classify(error),
        _ => StoreFault::Other,
    }
}

/// The fault behind a driver error, by SQLSTATE when the server answered, else by what
/// happened to the connection.
pub(crate) fn classify(error: &tokio_postgres::Error) -> StoreFault {
    if let Some(state) = error.code() {
        return classify_state(state);
    }
    if error.is_closed() {
        return StoreFault::Io;
    }
    // A refused, reset or timed-out connection carries the operating system's error.
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return if matches!(io.raw_os_error(), Some(23 | 24)) {
                StoreFault::TooManyFiles
            } else {
                StoreFault::Io
            };
        }
        source = cause.source();
    }
    StoreFault::Other
}

/// The fault behind a SQLSTATE.
pub(crate) fn classify_state(state: &SqlState) -> StoreFault {
    let code = state.code();
    if *state == SqlState::T_R_SERIALIZATION_FAILURE
        || *state == SqlState::T_R_DEADLOCK_DETECTED
        || *state == SqlState::LOCK_NOT_AVAILABLE
        || *state == SqlState::QUERY_CANCELED
    {
        StoreFault::Busy
    } else if *state == SqlState::DISK_FULL {
        StoreFault::DiskFull
    } else if *state == SqlState::READ_ONLY_SQL_TRANSACTION {
        StoreFault::ReadOnly
    } else if *state == SqlState::TOO_MANY_CONNECTIONS {
        StoreFault::TooManyFiles
    } else if *state == SqlState::DATA_CORRUPTED || *state == SqlState::INDEX_CORRUPTED {
        StoreFault::Corrupt
    } else if code.starts_with("08")
        || *state == SqlState::ADMIN_SHUTDOWN
        || *state == SqlState::CRASH_SHUTDOWN
        || *state == SqlState::CANNOT_CONNECT_NOW
    {
        // Class 08 (connection exception) and a server shutting down: the connection is
        // gone, a retry on a new one can succeed.
        StoreFault::Io
    } else {
        StoreFault::Other
    }
}

/// What the driver says, with the server's own message when the server refused the
/// statement (the driver's display stops at "db error"). The server's detail, which can
/// quote a row's values, is left out.
fn driver_words(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{error}: {}", db.message()),
        None => error.to_string(),
    }
}

/// The driver's words followed by what the operator can do about this kind of fault.
fn described(error: &str, fault: StoreFault) -> String {
    let advice = match fault {
        StoreFault::Busy => {
            "another transaction held a lock this one needed (a serialization failure, a \
             deadlock or a lock timeout): retry; if it persists, look for long transactions \
             in pg_stat_activity"
        }
        StoreFault::ReadOnly => {
            "the server accepts no writes (a standby, or default_transaction_read_only): \
             point [store] url at the primary"
        }
        StoreFault::DiskFull => {
            "the disk holding the database server's data is full: free space on the server, \
             then retry"
        }
        StoreFault::TooManyFiles => {
            "the server or this process has no connection or file descriptor to spare: raise \
             max_connections on the server (or ulimit -n here), or run fewer nodes, then retry"
        }
        StoreFault::Io => {
            "the database server could not be reached or the connection broke: check that it \
             is running and reachable at [store] url, then retry"
        }
        StoreFault::Corrupt => {
            "the server reports damaged data: restore the database from a backup"
        }
        _ => return error.to_owned(),
    };
    format!("{error}: {advice}")
}

/// Ends a transaction explicitly: commits its body's answer, or rolls back (and waits for
/// the rollback) on its body's error. Never left to `Drop`: a dropped transaction's
/// ROLLBACK is only queued on the connection, so its row locks could outlive the call and
/// make another connection's `SKIP LOCKED` claim pass over a row that is free.
pub(crate) async fn finish<T>(
    tx: deadpool_postgres::Transaction<'_>,
    result: Result<T, Failure>,
) -> Result<T, Failure> {
    match result {
        Ok(answer) => {
            tx.commit().await?;
            Ok(answer)
        }
        Err(error) => {
            // The body's error is the one worth reporting; a failed rollback ends the
            // session, which releases the locks as well.
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

/// Reads a 32-byte hash column, refusing any other length rather than panicking.
pub(crate) fn hash32(bytes: Vec<u8>, what: &str) -> Result<[u8; 32], Failure> {
    let len = bytes.len();
    bytes
        .try_into()
        .map_err(|_| Failure::Corrupt(format!("{what} is {len} bytes long, not 32")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_the_faults_a_retry_can_heal() {
        let cases = [
            ("40001", StoreFault::Busy),
            ("40P01", StoreFault::Busy),
            ("55P03", StoreFault::Busy),
            ("53100", StoreFault::DiskFull),
            ("25006", StoreFault::ReadOnly),
            ("53300", StoreFault::TooManyFiles),
            ("XX001", StoreFault::Corrupt),
            ("XX002", StoreFault::Corrupt),
            ("08006", StoreFault::Io),
            ("57P01", StoreFault::Io),
            ("23505", StoreFault::Other),
        ];
        for (code, fault) in cases {
            assert_eq!(classify_state(&SqlState::from_code(code)), fault, "{code}");
        }
    }

    #[test]
    fn every_retryable_message_says_what_to_do() {
        for fault in [
            StoreFault::Busy,
            StoreFault::ReadOnly,
            StoreFault::DiskFull,
            StoreFault::TooManyFiles,
            StoreFault::Io,
            StoreFault::Corrupt,
        ] {
            let text = described("boom", fault);
            assert!(text.starts_with("boom: "), "{text}");
            assert!(text.len() > 30, "{text}");
        }
    }
}
