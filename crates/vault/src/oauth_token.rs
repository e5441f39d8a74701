//! The sealed OAuth token record, and the one place it is opened for the wire.
//!
//! The OAuth client (`runwarden-oauth`) obtains, renews and keeps tokens as vault records
//! named `oauth.<hash of issuer, resource and scopes>`, kind `internal`, never listed by
//! `secret list`. It stays in the vault because [`Placement::OAuth`](crate::Placement)
//! reads the record at the wire: the egress client places the access token, with a DPoP
//! proof of the key sealed beside it, and no public method hands the token to a caller.

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::dpop::DpopKey;
use crate::error::VaultError;
use crate::secret::{SecretName, SecretValue};
use crate::vault::Vault;

/// The prefix of the vault records that hold OAuth tokens; [`Placement::OAuth`](crate::Placement)
/// reads no other.
pub const OAUTH_TOKEN_PREFIX: &str = "oauth.";

/// The sealed record of one OAuth token. Zeroized on drop; never printed (no `Debug`).
#[derive(Serialize, Deserialize, Zeroize, ZeroizeOnDrop)]
pub struct OAuthTokenRecord {
    /// The access token the wire places.
    pub access_token: String,
    /// The refresh token, when the authorization server gave one.
    pub refresh_token: Option<String>,
    /// When the access token expires, Unix milliseconds, when the server said.
    pub expires_at_ms: Option<i64>,
    /// When the token was obtained, Unix milliseconds.
    pub obtained_ms: i64,
    /// The DPoP key the token is bound to, in [`DpopKey::sealed_form`]; `None` for a bearer
    /// token.
    #[serde(default)]
    pub dpop_key: Option<String>,
}

impl Vault {
    /// The access token of an OAuth token record and the DPoP key it is bound to, for
    /// placement at the wire only ([`Placement::OAuth`](crate::Placement)). Reads no record
    /// outside the token namespace.
    pub(crate) async fn oauth_access_use(
        &self,
        name: &SecretName,
    ) -> Result<(SecretValue, Option<DpopKey>), VaultError> {
        let not_found = || VaultError::SecretNotFound {
            name: name.to_string(),
        };
        if !name.as_str().starts_with(OAUTH_TOKEN_PREFIX) {
            return Err(not_found());
        }
        let bytes = self
            .internal_get(name.as_str())
            .await?
            .ok_or_else(not_found)?;
        let record: OAuthTokenRecord = serde_json::from_slice(&bytes).map_err(|_| not_found())?;
        let key = match &record.dpop_key {
            // A bound token whose key cannot be read is not sent at all: without a proof
            // the server would refuse it anyway.
            Some(sealed) => Some(DpopKey::from_sealed_form(sealed).ok_or_else(not_found)?),
            None => None,
        };
        Ok((
            SecretValue::new(record.access_token.as_bytes().to_vec()),
            key,
        ))
    }
}
