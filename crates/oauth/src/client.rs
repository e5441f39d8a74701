//! One MCP server's OAuth client: its settings, where its records are, the token it places
//! and what a 401 or 403 does; the grants live in their own files.

use std::sync::Arc;
use std::time::Duration;

use runwarden_vault::audit::action;
use runwarden_vault::dpop::DpopKey;
use runwarden_vault::{
    CancellationSignal, Credential, EgressClient, EgressError, EgressRequest, EgressResponse,
    Method, Placement, SecretName, Vault, VaultError,
};
use serde::Serialize;
use url::Url;
use zeroize::Zeroizing;

use crate::assertion::AssertionSource;
use crate::challenge::Challenge;
use crate::error::OAuthError;
use crate::record::{BINDING_PREFIX, Binding, TokenRecord, expires_soon, hex_sha256};
use crate::settings::{Grant, OAuthSettings};

/// How many times one operation may widen its scopes after a 403 `insufficient_scope`
/// before it fails (the MCP spec's retry limit for scope challenges).
pub(crate) const STEP_UP_LIMIT: u32 = 2;

/// The bound of one metadata, registration or token request.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The largest metadata or token response read.
pub(crate) const MAX_BODY: usize = 256 * 1024;

pub(crate) use runwarden_base::now_ms;

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
    /// When the OAuth client obtained it, Unix milliseconds.
    pub obtained_ms: i64,
}

/// One MCP server's OAuth client: finds its authorization server, obtains, keeps, renews
/// and places its tokens. One per server per process; renewals are single-flight within
/// the process.
pub struct OAuthClient {
    pub(crate) egress: Arc<EgressClient>,
    pub(crate) server: String,
    pub(crate) url: Url,
    pub(crate) settings: OAuthSettings,
    pub(crate) prompt: Option<Arc<dyn AuthorizationPrompt>>,
    pub(crate) flight: tokio::sync::Mutex<()>,
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

    pub(crate) fn vault(&self) -> &Vault {
        self.egress.vault()
    }

    pub(crate) fn vault_error(&self, source: VaultError) -> OAuthError {
        OAuthError::Vault {
            server: self.server.clone(),
            source,
        }
    }

    pub(crate) fn binding_key(&self) -> String {
        format!(
            "{BINDING_PREFIX}{}",
            hex_sha256(&[&self.server, self.url.as_str()])
        )
    }

    pub(crate) async fn load_binding(&self) -> Result<Option<Binding>, OAuthError> {
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

    pub(crate) async fn load_token(&self, key: &str) -> Result<Option<TokenRecord>, OAuthError> {
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

    pub(crate) async fn save(
        &self,
        binding: &Binding,
        token: &TokenRecord,
    ) -> Result<(), OAuthError> {
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
    /// `REFRESH_SKEW` (a minute); `None` when none is held (the server's 401
    /// starts authorization).
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
        if expires_soon(&token, now_ms()) {
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

    pub(crate) fn held(&self, key: &str, obtained_ms: i64) -> Result<HeldToken, OAuthError> {
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
    /// `STEP_UP_LIMIT` (2) times per operation (`step_ups` counts the caller's so far).
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
                    .and_then(DpopKey::from_sealed_form)
                    .map(|key| key.thumbprint());
            }
        }
        Ok(status)
    }

    /// A GET of a metadata document: `Some` for a 2xx JSON answer, `None` for anything
    /// else a fallback may cure; a refusal or a transport failure is an error.
    pub(crate) async fn fetch_json<T: serde::de::DeserializeOwned>(
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

    pub(crate) async fn send(
        &self,
        request: EgressRequest,
        what: &'static str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<EgressResponse, OAuthError> {
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
}
