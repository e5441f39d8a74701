//! The server's knobs: what it offers and how it misbehaves on purpose.

use std::time::Duration;

/// Ways to make the server misbehave, or behave differently; change them at any time with
/// [`AuthServer::knobs`](crate::AuthServer::knobs).
#[derive(Debug, Clone)]
pub struct Knobs {
    /// Lifetime of access tokens (`expires_in`); short for refresh tests.
    pub access_ttl: Duration,
    /// Refresh tokens rotate: each use answers a new one and the old one dies (reuse is
    /// detected and revokes the whole family). Off: a refresh token stays valid.
    pub rotate_refresh_tokens: bool,
    /// Client credentials grants also answer a refresh token.
    pub refresh_for_client_credentials: bool,
    /// Every access token starts with this (a sigil for leak scans).
    pub access_token_prefix: String,
    /// Every refresh token starts with this.
    pub refresh_token_prefix: String,
    /// Scopes in `scopes_supported` of the AS metadata.
    pub scopes_supported: Vec<String>,
    /// The `issuer` the metadata documents claim (a wrong one for RFC 8414 section 3.3).
    pub metadata_issuer: Option<String>,
    /// The `token_endpoint` the metadata names instead of the real one.
    pub token_endpoint: Option<String>,
    /// The `authorization_endpoint` the metadata names instead of the real one.
    pub authorization_endpoint: Option<String>,
    /// The `authorization_servers` the protected resource metadata names instead of this
    /// server (e.g. a private address).
    pub authorization_servers: Option<Vec<String>>,
    /// The `iss` the authorization response carries instead of the issuer (RFC 9207).
    pub response_iss: Option<String>,
    /// The authorization response carries no `iss` at all.
    pub omit_response_iss: bool,
    /// Serve `/.well-known/oauth-authorization-server` (RFC 8414).
    pub serve_oauth_metadata: bool,
    /// Serve `/.well-known/openid-configuration`.
    pub serve_openid_metadata: bool,
    /// Offer and accept dynamic client registration (RFC 7591).
    pub registration_enabled: bool,
    /// Protected resources answer 403 `insufficient_scope` to a token without this scope,
    /// naming it in the challenge (step-up).
    pub required_scope: Option<String>,
    /// The token endpoint holds each refresh grant's answer this long (decided, not yet
    /// sent): refreshes from clients that do not wait for each other overlap for sure.
    pub refresh_delay: Duration,
    /// Scopes the server never grants, whatever is asked: with `required_scope` among
    /// them, a resource keeps answering 403 however often the client steps up.
    pub withheld_scopes: Vec<String>,
    /// DPoP (RFC 9449): the metadata offers ES256 proofs, a token request with a valid
    /// proof gets a token bound to its key (`token_type` DPoP), and resources take a bound
    /// token only with the DPoP scheme and a valid proof of that key.
    pub dpop: bool,
    /// With `dpop`: a token request without a proof is refused.
    pub dpop_required: bool,
    /// With `dpop`: the token endpoint and the resources each demand their own current
    /// nonce (`use_dpop_nonce`);
    /// [`AuthServer::rotate_dpop_nonces`](crate::AuthServer::rotate_dpop_nonces) changes them.
    pub dpop_nonces: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            access_ttl: Duration::from_secs(3600),
            rotate_refresh_tokens: true,
            refresh_for_client_credentials: false,
            access_token_prefix: "at-".into(),
            refresh_token_prefix: "rt-".into(),
            scopes_supported: vec![
                "mcp:read".into(),
                "mcp:write".into(),
                "offline_access".into(),
            ],
            metadata_issuer: None,
            token_endpoint: None,
            authorization_endpoint: None,
            authorization_servers: None,
            response_iss: None,
            omit_response_iss: false,
            serve_oauth_metadata: true,
            serve_openid_metadata: true,
            registration_enabled: true,
            required_scope: None,
            refresh_delay: Duration::ZERO,
            withheld_scopes: Vec::new(),
            dpop: false,
            dpop_required: false,
            dpop_nonces: false,
        }
    }
}
