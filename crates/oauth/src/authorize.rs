//! Authorization from the start: discovery (RFC 9728, then RFC 8414, else the 2025-03-26
//! rules), then the configured grant; the binding and the token are stored together.

use runwarden_vault::CancellationSignal;
use url::Url;

use crate::challenge::Challenge;
use crate::client::OAuthClient;
use crate::discovery::{self, ResourceMetadata, ServerMetadata};
use crate::error::OAuthError;
use crate::record::{Binding, Discovered, Identity, one_line, token_key};
use crate::settings::{AuthMethod, Grant};
use crate::token_request::choose_secret_method;

impl OAuthClient {
    /// Discovery, then the configured grant; stores the binding and the token.
    pub(crate) async fn authorize(
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

    /// RFC 9728 then RFC 8414, as the MCP spec orders them; without any Protected Resource
    /// Metadata, the 2025-03-26 rules (the server's origin is the authorization server).
    pub(crate) async fn discover(
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
    pub(crate) async fn discover_legacy(
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
    pub(crate) fn configured_identity(
        &self,
        metadata: &ServerMetadata,
    ) -> Result<Identity, OAuthError> {
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
}
