//! Enterprise-managed authorization (cross-app access): the operator's ID token is
//! exchanged at the enterprise identity provider for an Identity Assertion JWT
//! Authorization Grant (an ID-JAG, by an RFC 8693 token exchange), which the MCP server's
//! authorization server then takes in a JWT bearer grant (see `jwt_bearer.rs`).
//!
//! The ID token, the ID-JAG and the identity provider's client secret are secrets: they
//! go in request bodies and headers only, are zeroized after use, and no error, log line
//! or audit row quotes them.

use serde::Deserialize;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use runwarden_vault::audit::action;
use runwarden_vault::{CancellationSignal, EgressRequest, Method};

use crate::assertion::looks_like_jwt;
use crate::client::{MAX_BODY, OAuthClient, REQUEST_TIMEOUT};
use crate::error::AssertionLeg;
use crate::error::OAuthError;
use crate::jwt_bearer::withheld_if_quoting;
use crate::record::{TokenErrorResponse, one_line};
use crate::settings::IdentityProvider;
use crate::token_request::{basic_authorization, form_body};

/// The RFC 8693 token exchange grant.
const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// The token type of an OpenID Connect ID token (RFC 8693 §3).
const ID_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:id_token";

/// The token type of an Identity Assertion JWT Authorization Grant.
const ID_JAG_TYPE: &str = "urn:ietf:params:oauth:token-type:id-jag";

/// An identity provider's answer to the token exchange (RFC 8693 §2.2.1).
#[derive(Deserialize, Zeroize, ZeroizeOnDrop)]
struct ExchangeResponse {
    access_token: String,
    issued_token_type: Option<String>,
}

/// The token exchange form: the ID token for an ID-JAG addressed to the authorization
/// server (`audience`, its issuer) for the MCP server (`resource`).
pub(crate) fn exchange_form(
    id_token: &str,
    audience: &str,
    resource: &str,
    scopes: &[String],
) -> Vec<(&'static str, String)> {
    let mut form = vec![
        ("grant_type", TOKEN_EXCHANGE_GRANT.to_string()),
        ("requested_token_type", ID_JAG_TYPE.to_string()),
        ("audience", audience.to_string()),
        ("resource", resource.to_string()),
        ("subject_token", id_token.to_string()),
        ("subject_token_type", ID_TOKEN_TYPE.to_string()),
    ];
    if !scopes.is_empty() {
        form.push(("scope", scopes.join(" ")));
    }
    form
}

impl OAuthClient {
    /// The identity provider's leg: one token exchange, audited as `oauth_token`, through
    /// the guarded egress with the caller's signal. Answers the ID-JAG.
    pub(crate) async fn id_jag(
        &self,
        idp: &IdentityProvider,
        id_token: &str,
        audience: &str,
        resource: &str,
        scopes: &[String],
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Zeroizing<String>, OAuthError> {
        let mut form = exchange_form(id_token, audience, resource, scopes);
        let mut basic = None;
        match &idp.client_secret {
            Some(name) => {
                let secret = self
                    .vault()
                    .secret_use(name)
                    .await
                    .map_err(|e| self.vault_error(e))?;
                let secret = Zeroizing::new(String::from_utf8_lossy(secret.expose()).into_owned());
                basic = Some(basic_authorization(&idp.client_id, &secret));
            }
            None => form.push(("client_id", idp.client_id.clone())),
        }
        let body = form_body(&mut form);
        let mut request = EgressRequest::new(Method::Post, idp.token_endpoint.clone())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body.as_bytes().to_vec())
            .timeout(REQUEST_TIMEOUT)
            .max_response_bytes(MAX_BODY)
            .actor("oauth")
            .reason(format!(
                "oauth {} token exchange for an ID-JAG at the identity provider",
                self.server
            ))
            .audit_action(action::OAUTH_TOKEN);
        if let (Some(basic), Some(name)) = (&basic, &idp.client_secret) {
            // The configured IdP client secret goes to the IdP's token endpoint on purpose.
            request = request
                .header("authorization", basic.to_string())
                .carries_secret(name.as_str());
        }
        let response = self
            .send(request, "ID-JAG from the identity provider", signal)
            .await?;
        let body = Zeroizing::new(response.body);
        let failed = |error: String, description: Option<String>| OAuthError::AssertionRefused {
            server: self.server.clone(),
            leg: AssertionLeg::IdentityProvider,
            error: withheld_if_quoting(error, id_token),
            description: description.map(|d| withheld_if_quoting(d, id_token)),
        };
        if !(200..300).contains(&response.status) {
            return Err(match serde_json::from_slice::<TokenErrorResponse>(&body) {
                Ok(refusal) => failed(
                    one_line(&refusal.error),
                    refusal.error_description.as_deref().map(one_line),
                ),
                Err(_) => failed(format!("HTTP {}", response.status), None),
            });
        }
        let Ok(answer) = serde_json::from_slice::<ExchangeResponse>(&body) else {
            return Err(failed(
                "the answer is not the JSON of an RFC 8693 token exchange".into(),
                None,
            ));
        };
        match answer.issued_token_type.as_deref() {
            Some(ID_JAG_TYPE) => {}
            Some(other) => {
                return Err(failed(
                    format!("it issued a {}, not an ID-JAG", one_line(other)),
                    None,
                ));
            }
            None => return Err(failed("the answer names no issued_token_type".into(), None)),
        }
        if !looks_like_jwt(&answer.access_token) {
            return Err(failed("the ID-JAG it issued is not a JWT".into(), None));
        }
        Ok(Zeroizing::new(answer.access_token.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_asks_for_an_id_jag_for_the_authorization_server_and_the_resource() {
        let form = exchange_form(
            "id.token.sigil",
            "https://as.example",
            "https://mcp.example/mcp",
            &["mcp:read".into(), "mcp:write".into()],
        );
        let get = |name: &str| {
            form.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("grant_type"),
            Some("urn:ietf:params:oauth:grant-type:token-exchange")
        );
        assert_eq!(
            get("requested_token_type"),
            Some("urn:ietf:params:oauth:token-type:id-jag")
        );
        assert_eq!(
            get("subject_token_type"),
            Some("urn:ietf:params:oauth:token-type:id_token")
        );
        assert_eq!(get("subject_token"), Some("id.token.sigil"));
        assert_eq!(get("audience"), Some("https://as.example"));
        assert_eq!(get("resource"), Some("https://mcp.example/mcp"));
        assert_eq!(get("scope"), Some("mcp:read mcp:write"));
        let bare = exchange_form("a.b.c", "https://as", "https://r", &[]);
        assert!(bare.iter().all(|(n, _)| *n != "scope"), "no empty scope");
    }
}
