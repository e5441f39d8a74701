//! OAuth 2.1 for MCP servers, as the MCP authorization spec (2025-11-25) asks of a client
//! (M18, V3): discovery from a 401, issuer and resource checks, resource indicators,
//! client credentials and authorization code with PKCE, refresh with rotation, scope step-up,
//! and the assertion grants: the JWT bearer grant for workload identity (`jwt_bearer.rs`)
//! and enterprise-managed authorization, an ID token exchanged for an ID-JAG (`id_jag.rs`).
//!
//! Tokens are vault records, sealed like secrets (`oauth.<hash of issuer, resource and
//! scopes>`, kind `internal`, never listed by `secret list`). No public method returns one:
//! a caller gets a [`Credential`] naming the record with [`Placement::OAuth`], and the
//! egress client places the access token at the wire. Every metadata, registration and
//! token request goes through the guarded [`EgressClient`] (V4: a metadata document that
//! points at a private address is refused like any other target), is audited with its own
//! action (`oauth_metadata`, `oauth_registration`, `oauth_token`) and carries the caller's
//! signal.

mod assertion;
mod challenge;
mod crypto;
mod discovery;
pub(crate) mod dpop;
mod id_jag;
mod jwt_bearer;
mod loopback;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use url::Url;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

pub use assertion::{ASSERTION_COMMAND_TIMEOUT, AssertionSource};
pub use challenge::Challenge;
pub use crypto::SigningAlg;
pub use id_jag::IdentityProvider;
pub use jwt_bearer::AssertionLeg;

use crate::audit::action;
use crate::egress::{EgressClient, EgressRequest, Method};
use crate::error::{EgressError, VaultError};
use crate::placement::{Credential, Placement};
use crate::secret::{SecretName, SecretValue};
use crate::signal::CancellationSignal;
use crate::vault::{Vault, now_ms};
use discovery::{ResourceMetadata, ServerMetadata};

/// How many times one operation may widen its scopes after a 403 `insufficient_scope`
/// before it fails (the MCP spec's retry limit for scope challenges).
pub const STEP_UP_LIMIT: u32 = 2;

/// A token that expires within this long is renewed before use.
pub const REFRESH_SKEW: Duration = Duration::from_secs(60);

/// How long `mcp login` waits for the browser to come back to the loopback redirect.
pub const LOGIN_WAIT: Duration = Duration::from_secs(300);

/// The bound of one metadata, registration or token request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The largest metadata or token response read.
const MAX_BODY: usize = 256 * 1024;

/// How long a refresh lease lasts: longer than one token request's bound.
const LEASE_TTL: Duration = Duration::from_secs(30);

/// How long a renewal waits for another process's refresh before it gives up.
const LEASE_WAIT: Duration = Duration::from_secs(20);

/// The prefix of the vault records that hold tokens; [`Placement::OAuth`] reads no other.
const TOKEN_PREFIX: &str = "oauth.";

/// The prefix of the records that bind a server to its authorization server and client.
const BINDING_PREFIX: &str = "oauth-binding.";

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

/// Shows an operator the authorization URL to open (the CLI prints it). Only processes
/// with an operator at hand have one; elsewhere an authorization code grant that needs a
/// login fails with [`OAuthError::LoginRequired`].
pub trait AuthorizationPrompt: Send + Sync {
    /// Asks the operator to open `url` to authorize `server`.
    fn open(&self, server: &str, url: &str);
}

/// What the vault holds for a server, never a token (`runwarden mcp auth status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OAuthStatus {
    /// The configured grant.
    pub grant: &'static str,
    /// The authorization server's issuer, once discovered.
    pub issuer: Option<String>,
    /// The resource indicator tokens are bound to.
    pub resource: Option<String>,
    /// The scopes of the held token.
    pub scopes: Vec<String>,
    /// The client id in use (not secret).
    pub client_id: Option<String>,
    /// True when the client was registered dynamically.
    pub registered: bool,
    /// True when an access token is held.
    pub access_token: bool,
    /// True when a refresh token is held.
    pub refresh_token: bool,
    /// When the access token expires, Unix milliseconds, when the server said.
    pub expires_at_ms: Option<i64>,
    /// Set when the held token is DPoP-bound (RFC 9449): the thumbprint of its key
    /// (RFC 7638, public; the private key stays sealed in the vault).
    pub dpop_jkt: Option<String>,
    /// The assertion grants: where the JWT comes from (`file PATH`, `command PROGRAM`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion_source: Option<String>,
    /// `cross_app_access`: the identity provider's token endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_provider: Option<String>,
}

/// A held token as a credential to place, and when it was obtained (so a 401 can tell
/// whether someone renewed it since).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldToken {
    /// Names the sealed token; placed as `Authorization: Bearer`.
    pub credential: Credential,
    /// When the vault obtained it, Unix milliseconds.
    pub obtained_ms: i64,
}

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
    /// The server kept asking for more scope after [`STEP_UP_LIMIT`] step-ups.
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

/// The sealed token record. Zeroized on drop; never printed.
#[derive(Serialize, Deserialize, Zeroize, ZeroizeOnDrop)]
struct TokenRecord {
    access_token: String,
    refresh_token: Option<String>,
    expires_at_ms: Option<i64>,
    obtained_ms: i64,
    /// The DPoP key the token is bound to, in [`dpop::DpopKey::sealed_form`]; `None` for
    /// a bearer token.
    #[serde(default)]
    dpop_key: Option<String>,
}

impl TokenRecord {
    /// Renewal is due within [`REFRESH_SKEW`] of expiry, or within half the token's life
    /// for a token that lives less than twice that: a server's 30 s tokens are renewed
    /// at 15 s, not before every request.
    fn expires_soon(&self, now: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| {
            let life = (at - self.obtained_ms).max(0);
            let skew = (REFRESH_SKEW.as_millis() as i64).min(life / 2);
            at - now <= skew
        })
    }
}

/// Who the client is at the authorization server. Sealed inside the binding (a registered
/// client's secret is one).
#[derive(Clone, Serialize, Deserialize, Zeroize, ZeroizeOnDrop)]
struct Identity {
    client_id: String,
    /// A dynamically registered client's secret; a configured one stays in its secret.
    registered_secret: Option<String>,
    auth_method: String,
    registered: bool,
}

/// The sealed record binding a server to its authorization server, client and token.
#[derive(Serialize, Deserialize)]
struct Binding {
    metadata: ServerMetadata,
    resource: String,
    scopes: Vec<String>,
    token_key: String,
    identity: Identity,
}

/// What discovery found.
struct Discovered {
    metadata: ServerMetadata,
    resource: String,
    scopes_supported: Option<Vec<String>>,
}

/// A token endpoint's answer (RFC 6749 §5.1).
#[derive(Deserialize, Zeroize, ZeroizeOnDrop)]
struct TokenResponse {
    access_token: String,
    token_type: Option<String>,
    expires_in: Option<u64>,
    refresh_token: Option<String>,
}

/// A token endpoint's refusal (RFC 6749 §5.2).
#[derive(Deserialize)]
struct TokenErrorResponse {
    error: String,
    error_description: Option<String>,
}

fn hex_sha256(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0u8]);
    }
    hex::encode(hash.finalize())
}

/// The record name of the token for (issuer, resource, scopes): one cache entry each.
fn token_key(issuer: &str, resource: &str, scopes: &[String]) -> String {
    let mut sorted = scopes.to_vec();
    sorted.sort();
    sorted.dedup();
    format!(
        "{TOKEN_PREFIX}{}",
        hex_sha256(&[issuer, resource, &sorted.join(" ")])
    )
}

fn one_line(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    line.trim().to_string()
}

impl Vault {
    /// The access token of an OAuth token record and the DPoP key it is bound to, for
    /// placement at the wire only ([`Placement::OAuth`]). Reads no record outside the
    /// token namespace.
    pub(crate) async fn oauth_access_use(
        &self,
        name: &SecretName,
    ) -> Result<(SecretValue, Option<dpop::DpopKey>), VaultError> {
        let not_found = || VaultError::SecretNotFound {
            name: name.to_string(),
        };
        if !name.as_str().starts_with(TOKEN_PREFIX) {
            return Err(not_found());
        }
        let bytes = self
            .internal_get(name.as_str())
            .await?
            .ok_or_else(not_found)?;
        let record: TokenRecord = serde_json::from_slice(&bytes).map_err(|_| not_found())?;
        let key = match &record.dpop_key {
            // A bound token whose key cannot be read is not sent at all: without a proof
            // the server would refuse it anyway.
            Some(sealed) => Some(dpop::DpopKey::from_sealed_form(sealed).ok_or_else(not_found)?),
            None => None,
        };
        Ok((
            SecretValue::new(record.access_token.as_bytes().to_vec()),
            key,
        ))
    }
}

/// One MCP server's OAuth client: finds its authorization server, obtains, keeps, renews
/// and places its tokens. One per server per process; renewals are single-flight within
/// the process.
pub struct OAuthClient {
    egress: Arc<EgressClient>,
    server: String,
    url: Url,
    settings: OAuthSettings,
    prompt: Option<Arc<dyn AuthorizationPrompt>>,
    flight: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient")
            .field("server", &self.server)
            .field("grant", &self.settings.grant)
            .finish_non_exhaustive()
    }
}

impl OAuthClient {
    /// A client for the MCP server `server` at `url`.
    pub fn new(
        egress: Arc<EgressClient>,
        server: impl Into<String>,
        url: &str,
        settings: OAuthSettings,
    ) -> Result<Self, OAuthError> {
        let server = server.into();
        let url = Url::parse(url).map_err(|e| OAuthError::Config {
            server: server.clone(),
            problem: format!("the server url is not a URL ({e})"),
        })?;
        Ok(Self {
            egress,
            server,
            url,
            settings,
            prompt: None,
            flight: tokio::sync::Mutex::new(()),
        })
    }

    /// Lets an authorization code grant ask the operator (the CLI's prompt).
    pub fn with_prompt(mut self, prompt: Arc<dyn AuthorizationPrompt>) -> Self {
        self.prompt = Some(prompt);
        self
    }

    /// The configured grant.
    pub fn grant(&self) -> Grant {
        self.settings.grant
    }

    fn vault(&self) -> &Vault {
        self.egress.vault()
    }

    fn vault_error(&self, source: VaultError) -> OAuthError {
        OAuthError::Vault {
            server: self.server.clone(),
            source,
        }
    }

    fn binding_key(&self) -> String {
        format!(
            "{BINDING_PREFIX}{}",
            hex_sha256(&[&self.server, self.url.as_str()])
        )
    }

    async fn load_binding(&self) -> Result<Option<Binding>, OAuthError> {
        let Some(bytes) = self
            .vault()
            .internal_get(&self.binding_key())
            .await
            .map_err(|e| self.vault_error(e))?
        else {
            return Ok(None);
        };
        // A record this build cannot read is treated as absent: authorization starts over.
        Ok(serde_json::from_slice(&bytes).ok())
    }

    async fn load_token(&self, key: &str) -> Result<Option<TokenRecord>, OAuthError> {
        let Some(bytes) = self
            .vault()
            .internal_get(key)
            .await
            .map_err(|e| self.vault_error(e))?
        else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(&bytes).ok())
    }

    async fn save(&self, binding: &Binding, token: &TokenRecord) -> Result<(), OAuthError> {
        // The access token and a rotated refresh token are one sealed record, written in
        // one put: they are saved together or not at all.
        let token_bytes =
            Zeroizing::new(serde_json::to_vec(token).expect("a token record serializes"));
        self.vault()
            .internal_put(&binding.token_key, &token_bytes)
            .await
            .map_err(|e| self.vault_error(e))?;
        let binding_bytes =
            Zeroizing::new(serde_json::to_vec(binding).expect("a binding serializes"));
        self.vault()
            .internal_put(&self.binding_key(), &binding_bytes)
            .await
            .map_err(|e| self.vault_error(e))
    }

    /// The token to place on a request, renewed first when it expires within
    /// [`REFRESH_SKEW`]; `None` when none is held (the server's 401 starts authorization).
    pub async fn credential(
        &self,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Option<HeldToken>, OAuthError> {
        let Some(binding) = self.load_binding().await? else {
            return Ok(None);
        };
        let Some(mut token) = self.load_token(&binding.token_key).await? else {
            return Ok(None);
        };
        if token.expires_soon(now_ms()) {
            let _one = self.flight.lock().await;
            match self.renew_once(&binding, token.obtained_ms, signal).await {
                Ok(renewed) => token = renewed,
                // Without a refresh token an operator's grant cannot renew here: the
                // request goes without, and its 401 says what to do.
                Err(OAuthError::LoginRequired { .. }) => return Ok(None),
                Err(error) => return Err(error),
            }
        }
        Ok(Some(self.held(&binding.token_key, token.obtained_ms)?))
    }

    fn held(&self, key: &str, obtained_ms: i64) -> Result<HeldToken, OAuthError> {
        let secret = SecretName::new(key).map_err(|e| self.vault_error(e))?;
        Ok(HeldToken {
            credential: Credential {
                secret,
                placement: Placement::OAuth,
            },
            obtained_ms,
        })
    }

    /// Acts on a 401 or 403 from the MCP server. A 401 after a token was sent renews it
    /// (refresh, or client credentials again) unless someone already did; otherwise, and
    /// when renewal is refused, authorization starts over from discovery. A 403
    /// `insufficient_scope` widens the scopes and authorizes again, at most
    /// [`STEP_UP_LIMIT`] times per operation (`step_ups` counts the caller's so far).
    pub async fn challenge(
        &self,
        status: u16,
        www_authenticate: Option<&str>,
        sent: Option<&HeldToken>,
        step_ups: u32,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<(), OAuthError> {
        let challenge = Challenge::parse(www_authenticate.unwrap_or(""));
        let _one = self.flight.lock().await;
        if status == 403 {
            if !challenge.is_insufficient_scope() {
                return Err(OAuthError::Forbidden {
                    server: self.server.clone(),
                    error: challenge
                        .error
                        .clone()
                        .unwrap_or_else(|| "no error given".into()),
                });
            }
            if step_ups >= STEP_UP_LIMIT {
                return Err(OAuthError::StepUpLimit {
                    server: self.server.clone(),
                    limit: STEP_UP_LIMIT,
                });
            }
            let mut scopes = self
                .load_binding()
                .await?
                .map(|b| b.scopes)
                .unwrap_or_default();
            for scope in challenge.scope.iter().flatten() {
                if !scopes.contains(scope) {
                    scopes.push(scope.clone());
                }
            }
            return self.authorize(&challenge, Some(scopes), signal).await;
        }
        if let Some(sent) = sent
            && let Some(binding) = self.load_binding().await?
        {
            if binding.token_key != sent.credential.secret.as_str() {
                // Authorized afresh by another task since this request went out.
                return Ok(());
            }
            match self.renew_once(&binding, sent.obtained_ms, signal).await {
                Ok(_) => return Ok(()),
                Err(OAuthError::TokenRefused { .. } | OAuthError::LoginRequired { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        self.authorize(&challenge, None, signal).await
    }

    /// Forgets the held token of this server (its client registration stays), so the next
    /// request authorizes afresh: `runwarden mcp login` starts here.
    pub async fn forget(&self) -> Result<(), OAuthError> {
        if let Some(binding) = self.load_binding().await? {
            self.vault()
                .internal_delete(&binding.token_key)
                .await
                .map_err(|e| self.vault_error(e))?;
        }
        Ok(())
    }

    /// What is held for this server; never a token.
    pub async fn status(&self) -> Result<OAuthStatus, OAuthError> {
        let mut status = OAuthStatus {
            grant: self.settings.grant.as_str(),
            issuer: None,
            resource: None,
            scopes: Vec::new(),
            client_id: self.settings.client_id.clone(),
            registered: false,
            access_token: false,
            refresh_token: false,
            expires_at_ms: None,
            dpop_jkt: None,
            assertion_source: self
                .settings
                .assertion
                .as_ref()
                .map(AssertionSource::describe),
            identity_provider: self
                .settings
                .identity_provider
                .as_ref()
                .map(|idp| idp.token_endpoint.clone()),
        };
        if let Some(binding) = self.load_binding().await? {
            status.issuer = Some(binding.metadata.issuer.clone());
            status.resource = Some(binding.resource.clone());
            status.scopes = binding.scopes.clone();
            status.client_id = Some(binding.identity.client_id.clone());
            status.registered = binding.identity.registered;
            if let Some(token) = self.load_token(&binding.token_key).await? {
                status.access_token = true;
                status.refresh_token = token.refresh_token.is_some();
                status.expires_at_ms = token.expires_at_ms;
                status.dpop_jkt = token
                    .dpop_key
                    .as_deref()
                    .and_then(dpop::DpopKey::from_sealed_form)
                    .map(|key| key.thumbprint());
            }
        }
        Ok(status)
    }

    /// One renewal across every process on the store (M18): the first to take the token's
    /// refresh lease renews it; the others wait for the record to change and use the new
    /// token. A token obtained after `seen_ms` (the one the caller holds) is already new.
    async fn renew_once(
        &self,
        binding: &Binding,
        seen_ms: i64,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let holder = crypto::random_token(12);
        let key = &binding.token_key;
        let started = tokio::time::Instant::now();
        loop {
            let current = self.load_token(key).await?;
            if let Some(token) = current
                && token.obtained_ms > seen_ms
            {
                return Ok(token);
            }
            let leased = self
                .vault()
                .oauth_lease_acquire(key, &holder, LEASE_TTL.as_millis() as i64)
                .await
                .map_err(|e| self.vault_error(e))?;
            if leased {
                // Read again under the lease: a refresh may have landed just before it.
                let outcome = match self.load_token(key).await? {
                    Some(token) if token.obtained_ms > seen_ms => Ok(token),
                    Some(token) => self.renew(binding, &token, signal).await,
                    None => Err(OAuthError::LoginRequired {
                        server: self.server.clone(),
                    }),
                };
                if let Err(error) = self.vault().oauth_lease_release(key, &holder).await {
                    // It expires on its own; the next renewal waits at most LEASE_TTL.
                    tracing::warn!(server = %self.server, %error, "could not release the OAuth refresh lease");
                }
                return outcome;
            }
            if signal.is_some_and(|s| s.is_cancelled()) {
                return Err(OAuthError::Cancelled {
                    server: self.server.clone(),
                });
            }
            if started.elapsed() > LEASE_WAIT {
                return Err(OAuthError::Config {
                    server: self.server.clone(),
                    problem: format!(
                        "another process held the token's refresh lease for over {} s; try again",
                        LEASE_WAIT.as_secs()
                    ),
                });
            }
            // The other holder's refresh is one token request: poll the store for its
            // outcome (it is another process; nothing in this one can wake us).
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new token without the operator: refresh when a refresh token is held, else
    /// client credentials again; an authorization code grant without one needs a login.
    async fn renew(
        &self,
        binding: &Binding,
        token: &TokenRecord,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let mut form: Vec<(&str, String)> = Vec::new();
        let grant = if let Some(refresh) = &token.refresh_token {
            form.push(("grant_type", "refresh_token".into()));
            form.push(("refresh_token", refresh.clone()));
            "refresh_token"
        } else if self.settings.grant == Grant::ClientCredentials {
            form.push(("grant_type", "client_credentials".into()));
            if !binding.scopes.is_empty() {
                form.push(("scope", binding.scopes.join(" ")));
            }
            "client_credentials"
        } else if matches!(
            self.settings.grant,
            Grant::JwtBearer | Grant::CrossAppAccess
        ) {
            // The assertion grants renew by presenting a fresh assertion.
            let fresh = self
                .assertion_grant(
                    &binding.metadata,
                    &binding.identity,
                    &binding.scopes,
                    &binding.resource,
                    signal,
                )
                .await?;
            self.save(binding, &fresh).await?;
            return Ok(fresh);
        } else {
            return Err(OAuthError::LoginRequired {
                server: self.server.clone(),
            });
        };
        form.push(("resource", binding.resource.clone()));
        // A bound token is renewed with the key it is bound to (RFC 9449 §5).
        let key = token
            .dpop_key
            .as_deref()
            .and_then(dpop::DpopKey::from_sealed_form);
        let mut fresh = self
            .token_request_bound(
                &binding.metadata,
                &binding.identity,
                form,
                grant,
                key.as_ref(),
                signal,
            )
            .await?;
        // A server that does not rotate keeps the refresh token it gave before.
        if fresh.refresh_token.is_none() {
            fresh.refresh_token = token.refresh_token.clone();
        }
        self.save(binding, &fresh).await?;
        Ok(fresh)
    }

    /// Discovery, then the configured grant; stores the binding and the token.
    async fn authorize(
        &self,
        challenge: &Challenge,
        widened: Option<Vec<String>>,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<(), OAuthError> {
        let found = self.discover(challenge, signal).await?;
        // The MCP spec's scope selection: the challenge's, else scopes_supported, else
        // none; a configured list stands in before scopes_supported.
        let mut scopes = widened
            .or_else(|| challenge.scope.clone())
            .or_else(|| (!self.settings.scopes.is_empty()).then(|| self.settings.scopes.clone()))
            .or_else(|| found.scopes_supported.clone())
            .unwrap_or_default();
        let previous = self.load_binding().await?;
        let key = self.dpop_key_for(&found.metadata)?;
        let (identity, token) = match self.settings.grant {
            Grant::ClientCredentials => {
                let identity = self.configured_identity(&found.metadata)?;
                let mut form: Vec<(&str, String)> =
                    vec![("grant_type", "client_credentials".into())];
                if !scopes.is_empty() {
                    form.push(("scope", scopes.join(" ")));
                }
                form.push(("resource", found.resource.clone()));
                let token = self
                    .token_request_bound(
                        &found.metadata,
                        &identity,
                        form,
                        "client_credentials",
                        key.as_ref(),
                        signal,
                    )
                    .await?;
                (identity, token)
            }
            Grant::AuthorizationCode => {
                // SEP-2207: ask for offline_access only where the server lists it.
                if found
                    .metadata
                    .scopes_supported
                    .as_ref()
                    .is_some_and(|s| s.iter().any(|s| s == "offline_access"))
                    && !scopes.iter().any(|s| s == "offline_access")
                    && !scopes.is_empty()
                {
                    scopes.push("offline_access".into());
                }
                self.authorization_code(&found, &scopes, previous.as_ref(), key.as_ref(), signal)
                    .await?
            }
            Grant::JwtBearer | Grant::CrossAppAccess => {
                let identity = self.assertion_identity(&found.metadata)?;
                let token = self
                    .assertion_grant(&found.metadata, &identity, &scopes, &found.resource, signal)
                    .await?;
                (identity, token)
            }
        };
        let binding = Binding {
            token_key: token_key(&found.metadata.issuer, &found.resource, &scopes),
            metadata: found.metadata,
            resource: found.resource,
            scopes,
            identity,
        };
        self.save(&binding, &token).await
    }

    /// A GET of a metadata document: `Some` for a 2xx JSON answer, `None` for anything
    /// else a fallback may cure; a refusal or a transport failure is an error.
    async fn fetch_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        what: &'static str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Option<T>, OAuthError> {
        let request = EgressRequest::new(Method::Get, url)
            .header("accept", "application/json")
            .header("mcp-protocol-version", "2025-11-25")
            .timeout(REQUEST_TIMEOUT)
            .max_response_bytes(MAX_BODY)
            .actor("oauth")
            .reason(format!("oauth {} {what}", self.server))
            .audit_action(action::OAUTH_METADATA);
        let response = self.send(request, what, signal).await?;
        if !response.is_success() || response.truncated {
            return Ok(None);
        }
        Ok(serde_json::from_slice(&response.body).ok())
    }

    async fn send(
        &self,
        request: EgressRequest,
        what: &'static str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<crate::egress::EgressResponse, OAuthError> {
        self.egress
            .send(request, signal)
            .await
            .map_err(|error| match error {
                EgressError::CancelledBeforeSend | EgressError::CancelledInFlight { .. } => {
                    OAuthError::Cancelled {
                        server: self.server.clone(),
                    }
                }
                error => OAuthError::Egress {
                    server: self.server.clone(),
                    what,
                    source: Box::new(error),
                },
            })
    }

    /// RFC 9728 then RFC 8414, as the MCP spec orders them; without any Protected Resource
    /// Metadata, the 2025-03-26 rules (the server's origin is the authorization server).
    async fn discover(
        &self,
        challenge: &Challenge,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Discovered, OAuthError> {
        let mut prm: Option<ResourceMetadata> = None;
        if let Some(url) = &challenge.resource_metadata {
            prm = self
                .fetch_json(url, "protected resource metadata", signal)
                .await?;
            if prm.is_none() {
                return Err(OAuthError::Metadata {
                    server: self.server.clone(),
                    problem: "the protected resource metadata the server's challenge names could not be read".into(),
                });
            }
        } else {
            for url in discovery::resource_metadata_candidates(&self.url) {
                prm = self
                    .fetch_json(&url, "protected resource metadata", signal)
                    .await?;
                if prm.is_some() {
                    break;
                }
            }
        }
        let server_url = discovery::canonical_resource(&self.url);
        let Some(prm) = prm else {
            return self.discover_legacy(server_url, signal).await;
        };
        let resource = match &prm.resource {
            Some(resource) if discovery::resource_covers(resource, &self.url) => resource.clone(),
            Some(resource) => {
                return Err(OAuthError::ResourceMismatch {
                    server: self.server.clone(),
                    expected: server_url,
                    found: one_line(resource),
                });
            }
            None => server_url,
        };
        let Some(issuer) = prm.authorization_servers.first() else {
            return Err(OAuthError::Metadata {
                server: self.server.clone(),
                problem: "the protected resource metadata names no authorization server".into(),
            });
        };
        let issuer_url = Url::parse(issuer).map_err(|_| OAuthError::Metadata {
            server: self.server.clone(),
            problem: format!(
                "the authorization server {:?} is not a URL",
                one_line(issuer)
            ),
        })?;
        let mut metadata = None;
        for url in discovery::server_metadata_candidates(&issuer_url) {
            metadata = self
                .fetch_json::<ServerMetadata>(&url, "authorization server metadata", signal)
                .await?;
            if metadata.is_some() {
                break;
            }
        }
        let Some(metadata) = metadata else {
            return Err(OAuthError::Metadata {
                server: self.server.clone(),
                problem: format!(
                    "no authorization server metadata at {} (RFC 8414 or OpenID discovery)",
                    one_line(issuer)
                ),
            });
        };
        // RFC 8414 §3.3: the issuer must be the one the metadata was fetched for.
        if !discovery::same_url(&metadata.issuer, issuer) {
            return Err(OAuthError::IssuerMismatch {
                server: self.server.clone(),
                expected: one_line(issuer),
                found: one_line(&metadata.issuer),
            });
        }
        Ok(Discovered {
            metadata,
            resource,
            scopes_supported: prm.scopes_supported,
        })
    }

    /// 2025-03-26: the authorization server is the MCP server's origin; its RFC 8414
    /// metadata at the root, else the default endpoints `/authorize`, `/token`, `/register`.
    async fn discover_legacy(
        &self,
        resource: String,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Discovered, OAuthError> {
        let origin = discovery::origin(&self.url);
        let url = format!("{origin}/.well-known/oauth-authorization-server");
        let metadata = match self
            .fetch_json::<ServerMetadata>(&url, "authorization server metadata", signal)
            .await?
        {
            Some(metadata) => {
                // The legacy document may name an issuer with a path under the origin; it
                // must at least be the same origin it was fetched from.
                let same_origin = Url::parse(&metadata.issuer)
                    .is_ok_and(|issuer| discovery::origin(&issuer) == origin);
                if !same_origin {
                    return Err(OAuthError::IssuerMismatch {
                        server: self.server.clone(),
                        expected: origin,
                        found: one_line(&metadata.issuer),
                    });
                }
                metadata
            }
            None => ServerMetadata {
                issuer: origin.clone(),
                authorization_endpoint: Some(format!("{origin}/authorize")),
                token_endpoint: format!("{origin}/token"),
                registration_endpoint: Some(format!("{origin}/register")),
                scopes_supported: None,
                token_endpoint_auth_methods_supported: None,
                code_challenge_methods_supported: None,
                client_id_metadata_document_supported: false,
                authorization_response_iss_parameter_supported: false,
                dpop_signing_alg_values_supported: None,
            },
        };
        Ok(Discovered {
            metadata,
            resource,
            scopes_supported: None,
        })
    }

    /// The pre-registered client of the configuration, with its method.
    fn configured_identity(&self, metadata: &ServerMetadata) -> Result<Identity, OAuthError> {
        let Some(client_id) = self.settings.client_id.clone() else {
            return Err(OAuthError::Config {
                server: self.server.clone(),
                problem: "the client_credentials grant needs a client_id in [mcp.servers.NAME] auth.oauth".into(),
            });
        };
        let method = match self.settings.auth_method {
            Some(method) => method,
            None if self.settings.private_key.is_some() => AuthMethod::PrivateKeyJwt,
            None if self.settings.client_secret.is_some() => {
                choose_secret_method(metadata.token_endpoint_auth_methods_supported.as_deref())
            }
            None => AuthMethod::None,
        };
        Ok(Identity {
            client_id,
            registered_secret: None,
            auth_method: method.as_str().into(),
            registered: false,
        })
    }

    /// Authorization code with PKCE through the operator's browser and the loopback
    /// redirect; the client is the metadata document URL, the configured client or a
    /// registered one, in that order.
    async fn authorization_code(
        &self,
        found: &Discovered,
        scopes: &[String],
        previous: Option<&Binding>,
        key: Option<&dpop::DpopKey>,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<(Identity, TokenRecord), OAuthError> {
        let Some(prompt) = self.prompt.clone() else {
            return Err(OAuthError::LoginRequired {
                server: self.server.clone(),
            });
        };
        let metadata = &found.metadata;
        let Some(authorize_at) = metadata.authorization_endpoint.clone() else {
            return Err(OAuthError::Metadata {
                server: self.server.clone(),
                problem: "the authorization server has no authorization_endpoint".into(),
            });
        };
        if let Some(methods) = &metadata.code_challenge_methods_supported
            && !methods.iter().any(|m| m == "S256")
        {
            return Err(OAuthError::Config {
                server: self.server.clone(),
                problem:
                    "the authorization server does not offer PKCE with S256, which MCP requires"
                        .into(),
            });
        }
        let loopback = loopback::Loopback::bind()
            .await
            .map_err(|e| OAuthError::Config {
                server: self.server.clone(),
                problem: format!("cannot listen on 127.0.0.1 for the redirect: {e}"),
            })?;
        let redirect_uri = loopback.redirect_uri();
        let identity = match (&self.settings.client_metadata_url, &self.settings.client_id) {
            (Some(url), _) if metadata.client_id_metadata_document_supported => Identity {
                client_id: url.clone(),
                registered_secret: None,
                auth_method: AuthMethod::None.as_str().into(),
                registered: false,
            },
            (_, Some(_)) => self.configured_identity(metadata)?,
            _ => match previous {
                Some(b)
                    if b.identity.registered
                        && discovery::same_url(&b.metadata.issuer, &metadata.issuer) =>
                {
                    b.identity.clone()
                }
                _ => self.register(metadata, &redirect_uri, signal).await?,
            },
        };
        let pkce = crypto::Pkce::new();
        let state = crypto::random_token(16);
        let mut url = Url::parse(&authorize_at).map_err(|_| OAuthError::Metadata {
            server: self.server.clone(),
            problem: "the authorization_endpoint is not a URL".into(),
        })?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &identity.client_id)
                .append_pair("redirect_uri", &redirect_uri)
                .append_pair("code_challenge", &pkce.challenge)
                .append_pair("code_challenge_method", "S256")
                .append_pair("state", &state)
                .append_pair("resource", &found.resource);
            if !scopes.is_empty() {
                query.append_pair("scope", &scopes.join(" "));
            }
        }
        prompt.open(&self.server, url.as_str());
        let params = loopback
            .wait(LOGIN_WAIT, signal)
            .await
            .map_err(|wait| match wait {
                loopback::Wait::Cancelled => OAuthError::Cancelled {
                    server: self.server.clone(),
                },
                loopback::Wait::TimedOut => OAuthError::AuthorizationResponse {
                    server: self.server.clone(),
                    problem: format!(
                        "no answer at the redirect within {} s; run the login again",
                        LOGIN_WAIT.as_secs()
                    ),
                },
                loopback::Wait::Io(e) => OAuthError::AuthorizationResponse {
                    server: self.server.clone(),
                    problem: format!("the redirect listener failed: {e}"),
                },
            })?;
        let param = |name: &str| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let refuse = |problem: String| OAuthError::AuthorizationResponse {
            server: self.server.clone(),
            problem,
        };
        if param("state") != Some(state.as_str()) {
            return Err(refuse(
                "its state does not match the request's (a forged or stale redirect)".into(),
            ));
        }
        // RFC 9207 §2.4: the issuer that answered must be the one asked, compared as
        // strings (no normalisation: a trailing-slash variant is another issuer).
        match param("iss") {
            Some(iss) if iss != metadata.issuer => {
                return Err(refuse(format!(
                    "it comes from issuer {}, not {} (RFC 9207)",
                    one_line(iss),
                    metadata.issuer
                )));
            }
            None if metadata.authorization_response_iss_parameter_supported => {
                return Err(refuse(
                    "it lacks the iss parameter the authorization server promised (RFC 9207)"
                        .into(),
                ));
            }
            _ => {}
        }
        if let Some(error) = param("error") {
            return Err(refuse(format!(
                "the authorization server answered {}{}",
                one_line(error),
                param("error_description")
                    .map(|d| format!(" ({})", one_line(d)))
                    .unwrap_or_default()
            )));
        }
        let Some(code) = param("code") else {
            return Err(refuse("it carries no code".into()));
        };
        let form: Vec<(&str, String)> = vec![
            ("grant_type", "authorization_code".into()),
            ("code", code.to_string()),
            ("redirect_uri", redirect_uri),
            ("code_verifier", pkce.verifier.to_string()),
            ("resource", found.resource.clone()),
        ];
        let token = self
            .token_request_bound(metadata, &identity, form, "authorization_code", key, signal)
            .await?;
        Ok((identity, token))
    }

    /// RFC 7591 dynamic client registration; the result is sealed in the binding.
    async fn register(
        &self,
        metadata: &ServerMetadata,
        redirect_uri: &str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Identity, OAuthError> {
        let Some(endpoint) = &metadata.registration_endpoint else {
            return Err(OAuthError::Config {
                server: self.server.clone(),
                problem: "the authorization server offers no dynamic registration: configure a client_id (and client_secret) or a client_metadata_url".into(),
            });
        };
        let supported = metadata.token_endpoint_auth_methods_supported.as_deref();
        let wanted = match supported {
            Some(s) if s.iter().any(|m| m == "none") => Some("none"),
            Some(s) => s
                .iter()
                .find(|m| *m == "client_secret_basic" || *m == "client_secret_post")
                .map(String::as_str),
            None => None,
        };
        let mut body = serde_json::json!({
            "client_name": "runwarden",
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            // SEP-837: a loopback redirect makes this a native application.
            "application_type": "native",
        });
        if let Some(method) = wanted {
            body["token_endpoint_auth_method"] = method.into();
        }
        let request = EgressRequest::new(Method::Post, endpoint.clone())
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(body.to_string())
            .timeout(REQUEST_TIMEOUT)
            .max_response_bytes(MAX_BODY)
            .actor("oauth")
            .reason(format!("oauth {} client registration", self.server))
            .audit_action(action::OAUTH_REGISTRATION);
        let response = self.send(request, "client registration", signal).await?;
        #[derive(Deserialize)]
        struct Registered {
            client_id: String,
            client_secret: Option<String>,
            token_endpoint_auth_method: Option<String>,
        }
        let registered: Registered = match serde_json::from_slice(&response.body) {
            Ok(r) if response.is_success() => r,
            _ => {
                return Err(OAuthError::Config {
                    server: self.server.clone(),
                    problem: format!(
                        "the dynamic client registration failed (HTTP {}); configure a client_id instead",
                        response.status
                    ),
                });
            }
        };
        let method = match registered
            .token_endpoint_auth_method
            .as_deref()
            .and_then(AuthMethod::parse)
        {
            Some(method) => method,
            None if registered.client_secret.is_some() => choose_secret_method(supported),
            None => AuthMethod::None,
        };
        Ok(Identity {
            client_id: registered.client_id,
            registered_secret: registered.client_secret,
            auth_method: method.as_str().into(),
            registered: true,
        })
    }

    /// A secret of the vault, by name, as bytes.
    async fn secret(
        &self,
        name: &Option<SecretName>,
        what: &str,
    ) -> Result<SecretValue, OAuthError> {
        let Some(name) = name else {
            return Err(OAuthError::Config {
                server: self.server.clone(),
                problem: format!(
                    "the token endpoint method needs {what}; set it in [mcp.servers.NAME] auth.oauth"
                ),
            });
        };
        self.vault()
            .secret_use(name)
            .await
            .map_err(|e| self.vault_error(e))
    }

    /// One POST to the token endpoint with the client's authentication, for a bearer token.
    // Kept for grants that never bind their tokens; the grants of this file go through
    // `token_request_bound`, which binds where DPoP is used.
    #[allow(dead_code)]
    async fn token_request(
        &self,
        metadata: &ServerMetadata,
        identity: &Identity,
        form: Vec<(&str, String)>,
        grant: &'static str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        self.token_request_bound(metadata, identity, form, grant, None, signal)
            .await
    }

    /// One POST to the token endpoint with the client's authentication; with a DPoP key,
    /// a proof of it rides along and the token comes back bound to it (RFC 9449 §5).
    async fn token_request_bound(
        &self,
        metadata: &ServerMetadata,
        identity: &Identity,
        mut form: Vec<(&str, String)>,
        grant: &'static str,
        key: Option<&dpop::DpopKey>,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let method = AuthMethod::parse(&identity.auth_method).unwrap_or(AuthMethod::None);
        let mut basic: Option<Zeroizing<String>> = None;
        // The configured client secret goes to the token endpoint on purpose.
        let mut carries: Option<String> = None;
        match method {
            // An assertion grant may go without client authentication (RFC 7523 §3.1).
            AuthMethod::None if identity.client_id.is_empty() => {}
            AuthMethod::None => form.push(("client_id", identity.client_id.clone())),
            AuthMethod::ClientSecretBasic | AuthMethod::ClientSecretPost => {
                let secret = match &identity.registered_secret {
                    Some(secret) => Zeroizing::new(secret.clone()),
                    None => {
                        let value = self
                            .secret(&self.settings.client_secret, "a client_secret")
                            .await?;
                        carries = self.settings.client_secret.as_ref().map(|n| n.to_string());
                        Zeroizing::new(String::from_utf8_lossy(value.expose()).into_owned())
                    }
                };
                if method == AuthMethod::ClientSecretBasic {
                    basic = Some(basic_authorization(&identity.client_id, &secret));
                } else {
                    form.push(("client_id", identity.client_id.clone()));
                    form.push(("client_secret", secret.to_string()));
                }
            }
            AuthMethod::PrivateKeyJwt => {
                let pem = self
                    .secret(&self.settings.private_key, "a private_key")
                    .await?;
                let assertion = crypto::client_assertion(
                    pem.expose(),
                    self.settings.signing_alg,
                    &identity.client_id,
                    &metadata.issuer,
                    now_ms() / 1000,
                )
                .map_err(|problem| OAuthError::Config {
                    server: self.server.clone(),
                    problem: format!("cannot sign the client assertion: {problem}"),
                })?;
                form.push(("client_id", identity.client_id.clone()));
                form.push((
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".into(),
                ));
                form.push(("client_assertion", assertion.to_string()));
            }
        }
        let body = form_body(&mut form);
        let request = || {
            let mut request = EgressRequest::new(Method::Post, metadata.token_endpoint.clone())
                .header("content-type", "application/x-www-form-urlencoded")
                .header("accept", "application/json")
                .body(body.as_bytes().to_vec())
                .timeout(REQUEST_TIMEOUT)
                .max_response_bytes(MAX_BODY)
                .actor("oauth")
                .reason(format!("oauth {} token {grant}", self.server))
                .audit_action(action::OAUTH_TOKEN);
            if let Some(basic) = &basic {
                request = request.header("authorization", basic.to_string());
            }
            if let Some(name) = &carries {
                request = request.carries_secret(name);
            }
            request
        };
        let response = match key {
            None => self.send(request(), "token", signal).await?,
            Some(key) => self.send_with_proof(metadata, key, request, signal).await?,
        };
        let body = Zeroizing::new(response.body);
        if !(200..300).contains(&response.status) {
            let (error, description) = match serde_json::from_slice::<TokenErrorResponse>(&body) {
                Ok(refusal) => (
                    one_line(&refusal.error),
                    refusal.error_description.as_deref().map(one_line),
                ),
                Err(_) => (format!("HTTP {}", response.status), None),
            };
            return Err(OAuthError::TokenRefused {
                server: self.server.clone(),
                grant,
                error,
                description,
            });
        }
        let answer: TokenResponse =
            serde_json::from_slice(&body).map_err(|_| OAuthError::TokenRefused {
                server: self.server.clone(),
                grant,
                error: "the token response is not the JSON RFC 6749 §5.1 describes".into(),
                description: None,
            })?;
        // Asked with a proof, the token is bound unless the server says Bearer (RFC 9449
        // §5: then it is a plain bearer token); asked without, only Bearer will do.
        let bound = match (answer.token_type.as_deref(), key) {
            (Some(kind), Some(_)) if kind.eq_ignore_ascii_case(dpop::SCHEME) => true,
            (None, _) => false,
            (Some(kind), _) if kind.eq_ignore_ascii_case("bearer") => false,
            (Some(kind), _) => {
                return Err(OAuthError::TokenRefused {
                    server: self.server.clone(),
                    grant,
                    error: format!(
                        "the token type is {}, not {}",
                        one_line(kind),
                        if key.is_some() {
                            "DPoP or Bearer"
                        } else {
                            "Bearer"
                        }
                    ),
                    description: None,
                });
            }
        };
        let now = now_ms();
        Ok(TokenRecord {
            access_token: answer.access_token.clone(),
            refresh_token: answer.refresh_token.clone(),
            expires_at_ms: answer
                .expires_in
                .map(|s| now.saturating_add((s.min(10 * 365 * 86_400) * 1000) as i64)),
            obtained_ms: now,
            dpop_key: key.filter(|_| bound).map(dpop::DpopKey::sealed_form),
        })
    }
}

/// A token request's form, encoded as its body; the values (secrets, assertions, codes)
/// are wiped once encoded, and the body is wiped when dropped.
fn form_body(form: &mut [(&str, String)]) -> Zeroizing<String> {
    let body = Zeroizing::new(
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter().map(|(k, v)| (*k, v.as_str())))
            .finish(),
    );
    for (_, value) in form.iter_mut() {
        value.zeroize();
    }
    body
}

/// The `Authorization` value of `client_secret_basic`: RFC 6749 §2.3.1 form-encodes both
/// parts before base64.
fn basic_authorization(client_id: &str, secret: &str) -> Zeroizing<String> {
    let id: String = url::form_urlencoded::byte_serialize(client_id.as_bytes()).collect();
    let pass: Zeroizing<String> =
        Zeroizing::new(url::form_urlencoded::byte_serialize(secret.as_bytes()).collect());
    let pair = Zeroizing::new(format!("{id}:{}", pass.as_str()));
    Zeroizing::new(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
    ))
}

/// Basic unless the server lists only post (RFC 6749 makes Basic the default).
fn choose_secret_method(supported: Option<&[String]>) -> AuthMethod {
    match supported {
        Some(s)
            if !s.iter().any(|m| m == "client_secret_basic")
                && s.iter().any(|m| m == "client_secret_post") =>
        {
            AuthMethod::ClientSecretPost
        }
        _ => AuthMethod::ClientSecretBasic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(a.starts_with(TOKEN_PREFIX));
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
        assert!(!hour.expires_soon(3_539_999));
        assert!(hour.expires_soon(3_540_000));
        let short = record(0, Some(30_000));
        assert!(
            !short.expires_soon(1_000),
            "a fresh 30 s token is not renewed at once"
        );
        assert!(short.expires_soon(15_000));
        assert!(
            !record(0, None).expires_soon(i64::MAX / 2),
            "no expiry, no renewal"
        );
    }

    #[test]
    fn the_secret_method_is_basic_unless_only_post_is_offered() {
        assert_eq!(choose_secret_method(None), AuthMethod::ClientSecretBasic);
        assert_eq!(
            choose_secret_method(Some(&["client_secret_post".into()])),
            AuthMethod::ClientSecretPost
        );
        assert_eq!(
            choose_secret_method(Some(&[
                "client_secret_post".into(),
                "client_secret_basic".into()
            ])),
            AuthMethod::ClientSecretBasic
        );
    }
}
