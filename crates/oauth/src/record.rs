//! What the OAuth client keeps in the vault and reads from servers: the token record's key
//! and renewal rule, the binding of a server to its authorization server and client, and
//! the token endpoint's answers.

use std::time::Duration;

use runwarden_vault::OAUTH_TOKEN_PREFIX;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::discovery::ServerMetadata;

/// The sealed token record, defined by the vault because the wire reads it.
pub(crate) use runwarden_vault::OAuthTokenRecord as TokenRecord;

/// A token that expires within this long is renewed before use.
pub(crate) const REFRESH_SKEW: Duration = Duration::from_secs(60);

/// The prefix of the records that bind a server to its authorization server and client.
pub(crate) const BINDING_PREFIX: &str = "oauth-binding.";

/// Renewal is due within [`REFRESH_SKEW`] of expiry, or within half the token's life for a
/// token that lives less than twice that: a server's 30 s tokens are renewed at 15 s, not
/// before every request.
pub(crate) fn expires_soon(token: &TokenRecord, now: i64) -> bool {
    token.expires_at_ms.is_some_and(|at| {
        let life = (at - token.obtained_ms).max(0);
        let skew = (REFRESH_SKEW.as_millis() as i64).min(life / 2);
        at - now <= skew
    })
}

/// Who the client is at the authorization server. Sealed inside the binding (a registered
/// client's secret is one).
#[derive(Clone, Serialize, Deserialize, Zeroize, ZeroizeOnDrop)]
pub(crate) struct Identity {
    pub(crate) client_id: String,
    /// A dynamically registered client's secret; a configured one stays in its secret.
    pub(crate) registered_secret: Option<String>,
    pub(crate) auth_method: String,
    pub(crate) registered: bool,
}

/// The sealed record binding a server to its authorization server, client and token.
#[derive(Serialize, Deserialize)]
pub(crate) struct Binding {
    pub(crate) metadata: ServerMetadata,
    pub(crate) resource: String,
    pub(crate) scopes: Vec<String>,
    pub(crate) token_key: String,
    pub(crate) identity: Identity,
}

/// What discovery found.
pub(crate) struct Discovered {
    pub(crate) metadata: ServerMetadata,
    pub(crate) resource: String,
    pub(crate) scopes_supported: Option<Vec<String>>,
}

/// A token endpoint's answer (RFC 6749 §5.1).
#[derive(Deserialize, Zeroize, ZeroizeOnDrop)]
pub(crate) struct TokenResponse {
    pub(crate) access_token: String,
    pub(crate) token_type: Option<String>,
    pub(crate) expires_in: Option<u64>,
    pub(crate) refresh_token: Option<String>,
}

/// A token endpoint's refusal (RFC 6749 §5.2).
#[derive(Deserialize)]
pub(crate) struct TokenErrorResponse {
    pub(crate) error: String,
    pub(crate) error_description: Option<String>,
}

pub(crate) fn hex_sha256(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0u8]);
    }
    hex::encode(hash.finalize())
}

/// The record name of the token for (issuer, resource, scopes): one cache entry each.
pub(crate) fn token_key(issuer: &str, resource: &str, scopes: &[String]) -> String {
    let mut sorted = scopes.to_vec();
    sorted.sort();
    sorted.dedup();
    format!(
        "{OAUTH_TOKEN_PREFIX}{}",
        hex_sha256(&[issuer, resource, &sorted.join(" ")])
    )
}

pub(crate) use runwarden_base::one_line;

#[cfg(test)]
mod tests {
    use super::*;
    use runwarden_vault::SecretName;

    #[test]
    fn a_token_is_cached_per_issuer_resource_and_scopes() {
        let a = token_key("http://as", "http://r/mcp", &["b".into(), "a".into()]);
        assert_eq!(
            a,
            token_key("http://as", "http://r/mcp", &["a".into(), "b".into()])
        );
        assert_ne!(
            a,
            token_key("http://as", "http://other/mcp", &["a".into(), "b".into()])
        );
        assert_ne!(
            a,
            token_key("http://as2", "http://r/mcp", &["a".into(), "b".into()])
        );
        assert_ne!(a, token_key("http://as", "http://r/mcp", &["a".into()]));
        assert!(a.starts_with(OAUTH_TOKEN_PREFIX));
        assert!(SecretName::new(&a).is_ok());
    }

    fn record(obtained_ms: i64, expires_at_ms: Option<i64>) -> TokenRecord {
        TokenRecord {
            access_token: "t".into(),
            refresh_token: None,
            expires_at_ms,
            obtained_ms,
            dpop_key: None,
        }
    }

    #[test]
    fn a_token_is_renewed_a_minute_before_expiry_or_at_half_a_short_life() {
        let hour = record(0, Some(3_600_000));
        assert!(!expires_soon(&hour, 3_539_999));
        assert!(expires_soon(&hour, 3_540_000));
        let short = record(0, Some(30_000));
        assert!(
            !expires_soon(&short, 1_000),
            "a fresh 30 s token is not renewed at once"
        );
        assert!(expires_soon(&short, 15_000));
        assert!(
            !expires_soon(&record(0, None), i64::MAX / 2),
            "no expiry, no renewal"
        );
    }
}
