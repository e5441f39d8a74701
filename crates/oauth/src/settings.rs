//! A server's OAuth settings as the operator configured them: the grant, the client and
//! how it authenticates, the scopes, DPoP, and where an assertion grant's JWT comes from.

use runwarden_vault::SecretName;

use crate::assertion::AssertionSource;
use crate::crypto::SigningAlg;

/// Which OAuth grant obtains a server's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Client credentials (unattended agents; SEP-1046).
    ClientCredentials,
    /// Authorization code with PKCE, started by an operator (`runwarden mcp login`).
    AuthorizationCode,
    /// The JWT bearer grant (RFC 7523) with a workload's JWT from a file or a command
    /// (workload identity federation).
    JwtBearer,
    /// Enterprise-managed authorization (cross-app access): an ID token exchanged at the
    /// identity provider for an ID-JAG, then the JWT bearer grant with it.
    CrossAppAccess,
}

impl Grant {
    /// The name used in configuration and in `mcp auth status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientCredentials => "client_credentials",
            Self::AuthorizationCode => "authorization_code",
            Self::JwtBearer => "jwt_bearer",
            Self::CrossAppAccess => "cross_app_access",
        }
    }

    /// Parses a configured name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::ClientCredentials,
            Self::AuthorizationCode,
            Self::JwtBearer,
            Self::CrossAppAccess,
        ]
        .into_iter()
        .find(|g| g.as_str() == text)
    }
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// HTTP Basic with the client id and secret.
    ClientSecretBasic,
    /// The client id and secret in the form body.
    ClientSecretPost,
    /// A signed JWT assertion (RFC 7523 §2.2).
    PrivateKeyJwt,
    /// A public client: only its id.
    None,
}

impl AuthMethod {
    /// The RFC 7591 name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientSecretBasic => "client_secret_basic",
            Self::ClientSecretPost => "client_secret_post",
            Self::PrivateKeyJwt => "private_key_jwt",
            Self::None => "none",
        }
    }

    /// Parses an RFC 7591 name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::ClientSecretBasic,
            Self::ClientSecretPost,
            Self::PrivateKeyJwt,
            Self::None,
        ]
        .into_iter()
        .find(|m| m.as_str() == text)
    }
}

/// A server's OAuth settings as the operator configured them. Holds secret names only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// The grant.
    pub grant: Grant,
    /// A pre-registered client id; without one (and without a metadata document URL) the
    /// client registers itself (RFC 7591).
    pub client_id: Option<String>,
    /// The vault secret holding the pre-registered client's secret.
    pub client_secret: Option<SecretName>,
    /// The token endpoint authentication method; chosen from the server's metadata if unset.
    pub auth_method: Option<AuthMethod>,
    /// The vault secret holding a PKCS#8 PEM private key (`private_key_jwt`).
    pub private_key: Option<SecretName>,
    /// The assertion's algorithm.
    pub signing_alg: SigningAlg,
    /// A Client ID Metadata Document URL, used as the client id when the authorization
    /// server supports it.
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for when the server's challenge names none.
    pub scopes: Vec<String>,
    /// Bind tokens to a DPoP key (RFC 9449): `None` when the authorization server offers
    /// ES256 proofs, `Some(true)` always, `Some(false)` never.
    pub dpop: Option<bool>,
    /// The assertion grants: where the workload's JWT (`jwt_bearer`) or the ID token
    /// (`cross_app_access`) comes from.
    pub assertion: Option<AssertionSource>,
    /// `cross_app_access`: the identity provider that exchanges the ID token.
    pub identity_provider: Option<IdentityProvider>,
}

impl OAuthSettings {
    /// Settings of `grant` with everything else unset.
    pub fn new(grant: Grant) -> Self {
        Self {
            grant,
            client_id: None,
            client_secret: None,
            auth_method: None,
            private_key: None,
            signing_alg: SigningAlg::default(),
            client_metadata_url: None,
            scopes: Vec::new(),
            dpop: None,
            assertion: None,
            identity_provider: None,
        }
    }
}

/// The enterprise identity provider of the `cross_app_access` grant, as configured.
/// Holds a secret's name only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityProvider {
    /// Its token endpoint, where the ID token is exchanged for an ID-JAG.
    pub token_endpoint: String,
    /// This client's id at the identity provider.
    pub client_id: String,
    /// The vault secret holding this client's secret at the identity provider; without
    /// one the client id goes in the form (a public client).
    pub client_secret: Option<SecretName>,
}
