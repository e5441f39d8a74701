//! API tokens with roles (O2): random, shown once, stored only as a SHA-256 hash through
//! the [`TokenStore`] a backend implements (the store seam re-exports it).

use std::fmt;

use async_trait::async_trait;
use base64::Engine;
use chacha20poly1305::aead::OsRng;
use chacha20poly1305::aead::rand_core::RngCore;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use runwarden_base::StoreError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// May start and cancel runs, and read everything a viewer reads.
    Operator,
    /// May read runs, events, servers and the audit log.
    Viewer,
}

impl Role {
    /// The stable name used in storage and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Viewer => "viewer",
        }
    }

    /// Parses a stored or typed name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Operator, Self::Viewer]
            .into_iter()
            .find(|r| r.as_str() == text)
    }

    /// True when this role includes `needed`.
    pub fn allows(self, needed: Role) -> bool {
        self == Self::Operator || needed == Self::Viewer
    }
}

/// A token's record: who it is for and what it may do. Never its value or hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// A short public id (the first characters of the hash).
    pub id: String,
    /// A name for people ("ci", "alice").
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// When it was created, Unix milliseconds UTC.
    pub created_ms: i64,
}

/// A token's value, shown once. Zeroized on drop; `Debug` prints `[redacted]`.
pub struct TokenValue(Zeroizing<String>);

impl TokenValue {
    /// The value, to print once or to send as a bearer token.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TokenValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenValue([redacted])")
    }
}

/// Storage for API tokens: only their SHA-256 hashes are kept.
#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Stores a new token's record under its hash.
    async fn token_insert(&self, token: ApiToken, hash: [u8; 32]) -> Result<(), StoreError>;

    /// The token whose hash this is, if it exists and was not revoked.
    async fn token_find(&self, hash: [u8; 32]) -> Result<Option<ApiToken>, StoreError>;

    /// Every token's record (never a hash), oldest first.
    async fn token_list(&self) -> Result<Vec<ApiToken>, StoreError>;

    /// Revokes a token by id; answers whether it existed.
    async fn token_revoke(&self, id: &str) -> Result<bool, StoreError>;
}

/// The prefix of every token, so a leaked one is recognisable in a scan.
pub(crate) const TOKEN_PREFIX: &str = "rwt_";

/// The SHA-256 of a presented token. Tokens carry 256 random bits, so a plain hash is
/// enough to make the stored form useless to a reader of the database.
pub fn token_hash(presented: &str) -> [u8; 32] {
    Sha256::digest(presented.as_bytes()).into()
}

/// Creates and stores a token; its value is returned once and never stored.
pub async fn token_create(
    store: &dyn TokenStore,
    name: &str,
    role: Role,
    now_ms: i64,
) -> Result<(TokenValue, ApiToken), StoreError> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    OsRng.fill_bytes(bytes.as_mut());
    let value = Zeroizing::new(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes.as_ref())
    ));
    let hash = token_hash(&value);
    let record = ApiToken {
        id: hex::encode(&hash[..6]),
        name: name.to_string(),
        role,
        created_ms: now_ms,
    };
    store.token_insert(record.clone(), hash).await?;
    Ok((TokenValue(value), record))
}

/// The token a request presented, if it is a live one.
pub async fn token_verify(
    store: &dyn TokenStore,
    presented: &str,
) -> Result<Option<ApiToken>, StoreError> {
    if !presented.starts_with(TOKEN_PREFIX) || presented.len() > 200 {
        return Ok(None);
    }
    store.token_find(token_hash(presented)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_may_do_what_a_viewer_may_and_not_the_reverse() {
        assert!(Role::Operator.allows(Role::Viewer) && Role::Operator.allows(Role::Operator));
        assert!(Role::Viewer.allows(Role::Viewer) && !Role::Viewer.allows(Role::Operator));
    }

    #[test]
    fn a_token_value_never_prints() {
        let value = TokenValue(Zeroizing::new("rwt_secret".into()));
        assert_eq!(format!("{value:?}"), "TokenValue([redacted])");
    }
}

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

/// Storage for console sessions: only the SHA-256 of a session id is kept.
///
/// The session ids, their cookie and the CSRF tokens belong to the console in the binary;
/// this trait stays here, beside [`TokenStore`], because a session is a row bound to an API
/// token: a lookup answers only while its token is live, which both stores read in one
/// query over the token table. It is the lowest place both stores (which depend on the
/// vault and the runtime, never on the binary) can implement it.
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
