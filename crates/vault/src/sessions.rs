//! Console sessions (O4): a browser signs in with an API token and gets a random 256-bit
//! session id in a cookie. Only the id's SHA-256 is stored, bound to the token it was
//! opened with; a lookup answers only while the session is unexpired and its token is live,
//! so revoking a token ends its sessions at their next request. The CSRF token is derived
//! from the session id (never stored), so a reader of the database can forge neither.

use std::fmt;

use async_trait::async_trait;
use base64::Engine;
use chacha20poly1305::aead::OsRng;
use chacha20poly1305::aead::rand_core::RngCore;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::store::StoreError;
use crate::tokens::ApiToken;

/// A console session as a lookup answers it: the live token it acts for and when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    /// The token the session was opened with (id, name, role), read live at each lookup.
    pub token: ApiToken,
    /// When the session was opened, Unix milliseconds UTC.
    pub created_ms: i64,
    /// When it stops answering, Unix milliseconds UTC.
    pub expires_ms: i64,
}

/// A session id as the cookie carries it. Zeroized on drop; `Debug` prints `[redacted]`.
pub struct SessionId(Zeroizing<String>);

impl SessionId {
    /// The value, to set in the cookie once.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionId([redacted])")
    }
}

/// Storage for console sessions: only the SHA-256 of a session id is kept.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Stores a new session under its hash, bound to the token with id `token_id`.
    async fn session_insert(
        &self,
        hash: [u8; 32],
        token_id: &str,
        created_ms: i64,
        expires_ms: i64,
    ) -> Result<(), StoreError>;

    /// The session whose hash this is, if it expires after `now_ms` and its token is not
    /// revoked.
    async fn session_find(
        &self,
        hash: [u8; 32],
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>, StoreError>;

    /// Deletes a session (sign-out); answers whether it existed.
    async fn session_delete(&self, hash: [u8; 32]) -> Result<bool, StoreError>;

    /// Deletes every session that expired at or before `now_ms`; answers how many.
    async fn session_purge(&self, now_ms: i64) -> Result<u64, StoreError>;
}

/// The SHA-256 of a presented session id (256 random bits: a plain hash is enough).
pub fn session_hash(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// The CSRF token of a session: a hash of its id under its own label, so it differs from
/// the stored hash and cannot be computed from the database.
pub fn session_csrf(id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"runwarden console csrf\0");
    hasher.update(id.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hasher.finalize())
}

/// Compares a presented CSRF token with the expected one in time that does not depend on
/// where they differ.
pub fn csrf_matches(expected: &str, presented: &str) -> bool {
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Opens a session for `token` that lasts `ttl_ms`; its id is returned once.
pub async fn session_create(
    store: &dyn SessionStore,
    token: &ApiToken,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<(SessionId, ConsoleSession), StoreError> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    OsRng.fill_bytes(bytes.as_mut());
    let id =
        Zeroizing::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes.as_ref()));
    let expires_ms = now_ms.saturating_add(ttl_ms);
    store
        .session_insert(session_hash(&id), &token.id, now_ms, expires_ms)
        .await?;
    let session = ConsoleSession {
        token: token.clone(),
        created_ms: now_ms,
        expires_ms,
    };
    Ok((SessionId(id), session))
}

/// The live session a cookie presented, if any.
pub async fn session_lookup(
    store: &dyn SessionStore,
    presented: &str,
    now_ms: i64,
) -> Result<Option<ConsoleSession>, StoreError> {
    // Ids are 43 characters of URL-safe base64; anything else is not ours.
    if presented.len() != 43 {
        return Ok(None);
    }
    store.session_find(session_hash(presented), now_ms).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_never_prints() {
        let id = SessionId(Zeroizing::new("abc".into()));
        assert_eq!(format!("{id:?}"), "SessionId([redacted])");
    }

    #[test]
    fn the_csrf_token_is_not_the_stored_hash_and_compares_exactly() {
        let csrf = session_csrf("some-session");
        assert_ne!(csrf, hex::encode(session_hash("some-session")));
        assert_ne!(
            csrf,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(session_hash("some-session"))
        );
        assert!(csrf_matches(&csrf, &csrf.clone()));
        assert!(!csrf_matches(&csrf, &session_csrf("other-session")));
        assert!(!csrf_matches(&csrf, ""));
        assert!(!csrf_matches(&csrf, &csrf[..10]));
    }
}
