//! Why OAuth could not give a server a token: one error type, each variant naming the
//! server and what to do.

use runwarden_vault::{EgressError, VaultError};

/// Why OAuth could not give a server a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthError {
    /// A request to the authorization server or the metadata could not be made or finished.
    #[error("while fetching the {what} for server {server}: {source}")]
    Egress {
        /// The MCP server.
        server: String,
        /// Which request.
        what: &'static str,
        /// What the vault said.
        #[source]
        source: Box<EgressError>,
    },
    /// No usable metadata was found or it is malformed.
    #[error("server {server}: {problem}")]
    Metadata {
        /// The MCP server.
        server: String,
        /// What is wrong and where.
        problem: String,
    },
    /// RFC 8414 §3.3: the metadata names another issuer than the one it was fetched for.
    #[error(
        "server {server}: the authorization server metadata names issuer {found}, not {expected}; refused (RFC 8414 §3.3)"
    )]
    IssuerMismatch {
        /// The MCP server.
        server: String,
        /// The issuer the metadata was fetched for.
        expected: String,
        /// The issuer it names.
        found: String,
    },
    /// RFC 9728 §3.3: the Protected Resource Metadata is about another resource.
    #[error(
        "server {server}: the protected resource metadata is for {found}, not for {expected}; refused (RFC 9728 §3.3)"
    )]
    ResourceMismatch {
        /// The MCP server.
        server: String,
        /// The server's URL.
        expected: String,
        /// The resource the metadata names.
        found: String,
    },
    /// The token endpoint refused the request.
    #[error("server {server}: the authorization server refused the {grant} request: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    TokenRefused {
        /// The MCP server.
        server: String,
        /// The grant (`client_credentials`, `authorization_code`, `refresh_token`).
        grant: &'static str,
        /// The OAuth error code or HTTP status.
        error: String,
        /// The server's description, one line, cut to 200 characters.
        description: Option<String>,
    },
    /// A leg of the `jwt_bearer` or `cross_app_access` grant was refused or answered with
    /// something unusable. Not retried with the same assertion.
    #[error("server {server}: {leg} failed: {error}{}; {}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default(), leg.advice())]
    AssertionRefused {
        /// The MCP server.
        server: String,
        /// Which request failed.
        leg: AssertionLeg,
        /// The OAuth error code, the HTTP status, or what was wrong with the answer.
        error: String,
        /// The server's description, one line, cut to 200 characters.
        description: Option<String>,
    },
    /// The JWT of an assertion grant could not be read from its file or command.
    #[error("server {server}: no {what} to present: {problem}")]
    AssertionUnavailable {
        /// The MCP server.
        server: String,
        /// `assertion` or `ID token`.
        what: &'static str,
        /// What failed and where (never the content).
        problem: String,
    },
    /// An authorization code grant needs the operator, and this process has none.
    #[error(
        "server {server} needs an operator's authorization: run `runwarden mcp login {server}`"
    )]
    LoginRequired {
        /// The MCP server.
        server: String,
    },
    /// The authorization response was refused (state, issuer, error).
    #[error("server {server}: the authorization response was refused: {problem}")]
    AuthorizationResponse {
        /// The MCP server.
        server: String,
        /// What was wrong.
        problem: String,
    },
    /// The configuration cannot work with what the authorization server offers.
    #[error("server {server}: {problem}")]
    Config {
        /// The MCP server.
        server: String,
        /// What to change.
        problem: String,
    },
    /// The server kept asking for more scope after `STEP_UP_LIMIT` step-ups.
    #[error(
        "server {server} still answered 403 insufficient_scope after {limit} scope step-ups; check the scopes the client may hold"
    )]
    StepUpLimit {
        /// The MCP server.
        server: String,
        /// The limit.
        limit: u32,
    },
    /// A 403 that is not about scope: the token is valid and the server refuses anyway.
    #[error("server {server} refused the request (HTTP 403, {error})")]
    Forbidden {
        /// The MCP server.
        server: String,
        /// The challenge's error, or `no error given`.
        error: String,
    },
    /// The caller's signal stopped the authorization.
    #[error("the authorization of server {server} was cancelled")]
    Cancelled {
        /// The MCP server.
        server: String,
    },
    /// The vault could not read or store a record.
    #[error("while keeping the OAuth tokens of server {server}: {source}")]
    Vault {
        /// The MCP server.
        server: String,
        /// What the vault said.
        #[source]
        source: VaultError,
    },
}

/// Which request of an assertion grant failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AssertionLeg {
    /// The token exchange of the ID token for an ID-JAG at the identity provider.
    IdentityProvider,
    /// The JWT bearer grant of the workload's assertion at the authorization server.
    WorkloadAssertion,
    /// The JWT bearer grant of the ID-JAG at the authorization server.
    IdJag,
}

impl AssertionLeg {
    /// What the operator can check.
    pub fn advice(self) -> &'static str {
        match self {
            Self::IdentityProvider => {
                "check that the ID token is current and was issued to idp_client_id, and that the identity provider lets this client reach the MCP server's authorization server"
            }
            Self::WorkloadAssertion => {
                "check that the assertion is current, addressed to the authorization server (its aud) and issued by an issuer it trusts"
            }
            Self::IdJag => {
                "check client_id and client_secret, and that the authorization server trusts the identity provider"
            }
        }
    }
}

impl std::fmt::Display for AssertionLeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::IdentityProvider => "the identity provider's token exchange for an ID-JAG",
            Self::WorkloadAssertion => "the authorization server's JWT bearer grant",
            Self::IdJag => "the authorization server's JWT bearer grant of the ID-JAG",
        })
    }
}
