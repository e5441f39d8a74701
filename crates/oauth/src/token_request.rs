//! One request to the token endpoint: the client's authentication (a secret, Basic or in
//! the form, or a signed assertion), an optional DPoP proof, and the answer read as a token
//! record or a refusal.

use base64::Engine;
use runwarden_vault::audit::action;
use runwarden_vault::dpop::{self, DpopKey};
use runwarden_vault::{
    CancellationSignal, EgressRequest, EgressResponse, Method, SecretName, SecretValue,
};
use zeroize::{Zeroize, Zeroizing};

use crate::client::{MAX_BODY, OAuthClient, REQUEST_TIMEOUT, now_ms};
use crate::crypto;
use crate::discovery::ServerMetadata;
use crate::error::OAuthError;
use crate::record::{Identity, TokenErrorResponse, TokenRecord, TokenResponse, one_line};
use crate::settings::AuthMethod;

impl OAuthClient {
    /// A secret of the vault, by name, as bytes.
    pub(crate) async fn secret(
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
    pub(crate) async fn token_request(
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
    pub(crate) async fn token_request_bound(
        &self,
        metadata: &ServerMetadata,
        identity: &Identity,
        mut form: Vec<(&str, String)>,
        grant: &'static str,
        key: Option<&DpopKey>,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let (basic, carries) = self.authenticate(metadata, identity, &mut form).await?;
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
        self.token_answer(response, grant, key)
    }

    /// The client's authentication at the token endpoint, by its method: nothing, its id,
    /// its secret (an `Authorization: Basic` value, or in the form) or a signed assertion
    /// in the form. Answers the Basic value and the name of the secret the request carries
    /// on purpose.
    async fn authenticate(
        &self,
        metadata: &ServerMetadata,
        identity: &Identity,
        form: &mut Vec<(&str, String)>,
    ) -> Result<(Option<Zeroizing<String>>, Option<String>), OAuthError> {
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
        Ok((basic, carries))
    }

    /// The token endpoint's answer as a token record, or its refusal. Asked with a proof
    /// of `key`, the token is bound to it unless the server says Bearer.
    fn token_answer(
        &self,
        response: EgressResponse,
        grant: &'static str,
        key: Option<&DpopKey>,
    ) -> Result<TokenRecord, OAuthError> {
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
            dpop_key: key.filter(|_| bound).map(DpopKey::sealed_form),
        })
    }
}

/// A token request's form, encoded as its body; the values (secrets, assertions, codes)
/// are wiped once encoded, and the body is wiped when dropped.
pub(crate) fn form_body(form: &mut [(&str, String)]) -> Zeroizing<String> {
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
pub(crate) fn basic_authorization(client_id: &str, secret: &str) -> Zeroizing<String> {
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
pub(crate) fn choose_secret_method(supported: Option<&[String]>) -> AuthMethod {
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
