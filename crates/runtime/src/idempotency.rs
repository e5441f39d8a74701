//! Idempotent run creation: a client that retries `POST /v1/runs` with the same
//! `Idempotency-Key` gets the run its first request made, never a second one. The store
//! keeps each key with its scope (who sent it), the hash of the request's canonical body
//! and the run it made, for at least [`IDEMPOTENCY_RETENTION_MS`]; a unique constraint on
//! (scope, key) makes two racing requests create one run.

pub use crate::store::{KeyedCreate, RunCreateKeyed};

/// How long a key is honoured: a key older than this may be used again for a new run.
pub const IDEMPOTENCY_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// The longest key accepted, in bytes.
pub const IDEMPOTENCY_KEY_MAX: usize = 255;

/// Why a key is refused before it reaches the store, if it is.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_MAX {
        return Err(format!(
            "an idempotency key has 1 to {IDEMPOTENCY_KEY_MAX} characters; this one has {}",
            key.len()
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "an idempotency key is printable ASCII without spaces (a UUID is a good one)".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_printable_ascii_of_bounded_length() {
        assert!(check_key("0190f3a2-7c1e-7000-8000-000000000001").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key("has space").is_err());
        assert!(check_key(&"k".repeat(IDEMPOTENCY_KEY_MAX + 1)).is_err());
        assert!(check_key(&"k".repeat(IDEMPOTENCY_KEY_MAX)).is_ok());
    }
}
