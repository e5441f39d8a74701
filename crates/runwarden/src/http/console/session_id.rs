//! Console session ids and CSRF tokens: a browser signs in with an API token and gets a
//! random 256-bit session id in a cookie. Only the id's SHA-256 is stored (through the
//! vault's [`SessionStore`]), bound to the token it was opened with; a lookup answers only
//! while the session is unexpired and its token is live, so revoking a token ends its
//! sessions at their next request. The CSRF token is derived from the session id (never
//! stored), so a reader of the database can forge neither.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use runwarden_base::StoreError;
use runwarden_vault::{ApiToken, ConsoleSession, SessionStore};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// A session id as the cookie carries it. Zeroized on drop; `Debug` prints `[redacted]`.
pub(crate) struct SessionId(Zeroizing<String>);

impl SessionId {
    /// The value, to set in the cookie once.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionId([redacted])")
    }
}

/// The SHA-256 of a presented session id (256 random bits: a plain hash is enough).
pub(crate) fn session_hash(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// The CSRF token of a session: a hash of its id under its own label, so it differs from
/// the stored hash and cannot be computed from the database.
pub(crate) fn session_csrf(id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"runwarden console csrf\0");
    hasher.update(id.as_bytes());
    URL_SAFE_NO_PAD.encode(hasher.finalize())
}

/// Compares a presented CSRF token with the expected one in time that does not depend on
/// where they differ.
pub(crate) fn csrf_matches(expected: &str, presented: &str) -> bool {
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Opens a session for `token` that lasts `ttl_ms`; its id is returned once.
pub(crate) async fn session_create(
    store: &dyn SessionStore,
    token: &ApiToken,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<(SessionId, ConsoleSession), StoreError> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    SystemRandom::new().fill(bytes.as_mut()).map_err(|_| {
        StoreError::new(
            "opening a console session",
            "the operating system's random generator failed",
        )
    })?;
    let id = Zeroizing::new(URL_SAFE_NO_PAD.encode(bytes.as_ref()));
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
pub(crate) async fn session_lookup(
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
        assert_ne!(csrf, URL_SAFE_NO_PAD.encode(session_hash("some-session")));
        assert!(csrf_matches(&csrf, &csrf.clone()));
        assert!(!csrf_matches(&csrf, &session_csrf("other-session")));
        assert!(!csrf_matches(&csrf, ""));
        assert!(!csrf_matches(&csrf, &csrf[..10]));
    }
}
