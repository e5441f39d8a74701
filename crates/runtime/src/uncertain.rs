//! A write whose commit outcome is unknown, decided the same way by every store: an I/O
//! fault (the answer to a PostgreSQL COMMIT lost with its connection, a SQLite commit
//! that reported an I/O error after its frames reached the log) may have been stored, so
//! the store re-reads before anyone acts on it. What the re-read finds is the call's
//! answer; when it finds nothing, or cannot read, the original error stands. Read as "not
//! stored" without looking, a recorded write step would end `FENCED_WRITE`, and a fence
//! in place would be taken for none.

use runwarden_vault::store::{StoreError, StoreFault};

/// Whether a write that failed with `error` may have been stored nevertheless.
pub fn outcome_unknown(error: &StoreError) -> bool {
    error.fault == StoreFault::Io
}

/// The answer to a write that failed with `error` (an unknown outcome), given what a
/// re-read `found`: `Some(answer)` when the write is there.
pub fn after_reread<T, E>(
    error: StoreError,
    operation: &str,
    found: Result<Option<T>, E>,
) -> Result<T, StoreError> {
    match found {
        Ok(Some(answer)) => {
            tracing::warn!(operation, %error, "the answer to a write was lost; a re-read shows it was stored");
            Ok(answer)
        }
        Ok(None) | Err(_) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_io_fault_is_re_read_and_only_a_found_write_replaces_the_error() {
        let io = StoreError::with_fault("w", StoreFault::Io, "lost");
        assert!(outcome_unknown(&io));
        assert!(!outcome_unknown(&StoreError::with_fault(
            "w",
            StoreFault::Busy,
            "busy"
        )));
        assert_eq!(
            after_reread(io.clone(), "w", Ok::<_, ()>(Some(7))).unwrap(),
            7
        );
        assert!(after_reread(io.clone(), "w", Ok::<Option<i32>, ()>(None)).is_err());
        assert!(after_reread(io, "w", Err::<Option<i32>, _>(())).is_err());
    }
}
