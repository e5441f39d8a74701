//! The authorization code grant with PKCE, through the operator's browser and a loopback
//! redirect, and dynamic client registration (RFC 7591) when no client is configured.

use std::time::Duration;

use runwarden_vault::audit::action;
use runwarden_vault::dpop::DpopKey;
use runwarden_vault::{CancellationSignal, EgressRequest, Method};
use serde::Deserialize;
use url::Url;

use crate::client::{MAX_BODY, OAuthClient, REQUEST_TIMEOUT};
use crate::crypto;
use crate::discovery::{self, ServerMetadata};
use crate::error::OAuthError;
use crate::loopback;
use crate::record::{Binding, Discovered, Identity, TokenRecord, one_line};
use crate::settings::AuthMethod;
use crate::token_request::choose_secret_method;

/// How long `mcp login` waits for the browser to come back to the loopback redirect.
pub const LOGIN_WAIT: Duration = Duration::from_secs(300);

impl OAuthClient {
    /// Authorization code with PKCE through the operator's browser and the loopback
    /// redirect; the client is the metadata document URL, the configured client or a
    /// registered one, in that order.
    pub(crate) async fn authorization_code(
        &self,
        found: &Discovered,
        scopes: &[String],
        previous: Option<&Binding>,
        key: Option<&DpopKey>,
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
        let identity = self
            .login_identity(metadata, previous, &redirect_uri, signal)
            .await?;
        let pkce = crypto::Pkce::new();
        let state = crypto::random_token(16);
        let url = self.authorization_url(
            &authorize_at,
            &identity,
            &redirect_uri,
            &pkce,
            &state,
            &found.resource,
            scopes,
        )?;
        prompt.open(&self.server, url.as_str());
        let params = self.redirect(&loopback, signal).await?;
        let code = self.authorization_response(&params, &state, metadata)?;
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

    /// The client of a login: the metadata document URL where the server supports it, the
    /// configured client, the client registered before with the same issuer, or a new
    /// registration.
    async fn login_identity(
        &self,
        metadata: &ServerMetadata,
        previous: Option<&Binding>,
        redirect_uri: &str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Identity, OAuthError> {
        Ok(
            match (&self.settings.client_metadata_url, &self.settings.client_id) {
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
                    _ => self.register(metadata, redirect_uri, signal).await?,
                },
            },
        )
    }

    /// The URL the operator opens: the authorization request with PKCE, `state` and the
    /// resource indicator.
    #[allow(clippy::too_many_arguments)] // one request's parameters, each named once
    fn authorization_url(
        &self,
        authorize_at: &str,
        identity: &Identity,
        redirect_uri: &str,
        pkce: &crypto::Pkce,
        state: &str,
        resource: &str,
        scopes: &[String],
    ) -> Result<Url, OAuthError> {
        let mut url = Url::parse(authorize_at).map_err(|_| OAuthError::Metadata {
            server: self.server.clone(),
            problem: "the authorization_endpoint is not a URL".into(),
        })?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &identity.client_id)
                .append_pair("redirect_uri", redirect_uri)
                .append_pair("code_challenge", &pkce.challenge)
                .append_pair("code_challenge_method", "S256")
                .append_pair("state", state)
                .append_pair("resource", resource);
            if !scopes.is_empty() {
                query.append_pair("scope", &scopes.join(" "));
            }
        }
        Ok(url)
    }

    /// The query of the browser's return to the loopback redirect, within [`LOGIN_WAIT`].
    async fn redirect(
        &self,
        loopback: &loopback::Loopback,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Vec<(String, String)>, OAuthError> {
        loopback
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
            })
    }

    /// The code of an authorization response, once its state and issuer are the request's
    /// and it carries no error.
    fn authorization_response<'a>(
        &self,
        params: &'a [(String, String)],
        state: &str,
        metadata: &ServerMetadata,
    ) -> Result<&'a str, OAuthError> {
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
        if param("state") != Some(state) {
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
        param("code").ok_or_else(|| refuse("it carries no code".into()))
    }

    /// RFC 7591 dynamic client registration; the result is sealed in the binding.
    pub(crate) async fn register(
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
}
