//! The JWT bearer grant (RFC 7523 §2.1) and the two grants built on it: `jwt_bearer`, for
//! workload identity federation, presents a JWT the platform gives the workload (a file
//! or a command's output); `cross_app_access` (enterprise-managed authorization) presents
//! the ID-JAG the identity provider exchanged for the operator's ID token (`id_jag.rs`).
//!
//! Neither grant is retried with the same assertion after a refusal, nor replaced by
//! another grant: the refusal reaches the caller, naming the leg that failed.

use zeroize::Zeroizing;

use runwarden_vault::CancellationSignal;

use crate::assertion::{ASSERTION_COMMAND_TIMEOUT, Problem};
use crate::client::OAuthClient;
use crate::discovery::ServerMetadata;
use crate::error::{AssertionLeg, OAuthError};
use crate::record::{Identity, TokenRecord};
use crate::settings::{AuthMethod, Grant};

/// The RFC 7523 JWT bearer authorization grant.
const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// The JWT bearer grant's form: the assertion for a token bound to `resource`.
pub(crate) fn jwt_bearer_form(
    assertion: &str,
    scopes: &[String],
    resource: &str,
) -> Vec<(&'static str, String)> {
    let mut form = vec![
        ("grant_type", JWT_BEARER_GRANT.to_string()),
        ("assertion", assertion.to_string()),
    ];
    if !scopes.is_empty() {
        form.push(("scope", scopes.join(" ")));
    }
    form.push(("resource", resource.to_string()));
    form
}

impl OAuthClient {
    /// The client of an assertion grant: the configured one, or none at all, since
    /// RFC 7523 §3.1 makes client authentication optional with this grant.
    pub(crate) fn assertion_identity(
        &self,
        metadata: &ServerMetadata,
    ) -> Result<Identity, OAuthError> {
        if self.settings.client_id.is_some() {
            return self.configured_identity(metadata);
        }
        Ok(Identity {
            client_id: String::new(),
            registered_secret: None,
            auth_method: AuthMethod::None.as_str().into(),
            registered: false,
        })
    }

    /// A token by the configured assertion grant: the workload's JWT, or the ID token
    /// exchanged for an ID-JAG, then the JWT bearer grant at the authorization server.
    /// Every leg reads its JWT afresh.
    pub(crate) async fn assertion_grant(
        &self,
        metadata: &ServerMetadata,
        identity: &Identity,
        scopes: &[String],
        resource: &str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let (assertion, leg) = if self.settings.grant == Grant::CrossAppAccess {
            let Some(idp) = &self.settings.identity_provider else {
                return Err(OAuthError::Config {
                    server: self.server.clone(),
                    problem: "the cross_app_access grant needs idp_token_endpoint and idp_client_id in [mcp.servers.NAME] auth.oauth".into(),
                });
            };
            let id_token = self.read_jwt("ID token", signal).await?;
            let jag = self
                .id_jag(idp, &id_token, &metadata.issuer, resource, scopes, signal)
                .await?;
            (jag, AssertionLeg::IdJag)
        } else {
            (
                self.read_jwt("assertion", signal).await?,
                AssertionLeg::WorkloadAssertion,
            )
        };
        let form = jwt_bearer_form(&assertion, scopes, resource);
        self.token_request(metadata, identity, form, "jwt_bearer", signal)
            .await
            .map_err(|error| match error {
                OAuthError::TokenRefused {
                    server,
                    error,
                    description,
                    ..
                } => OAuthError::AssertionRefused {
                    server,
                    leg,
                    error: withheld_if_quoting(error, &assertion),
                    description: description.map(|d| withheld_if_quoting(d, &assertion)),
                },
                error => error,
            })
    }

    /// The configured JWT (`what`: "assertion" or "ID token"), read now.
    async fn read_jwt(
        &self,
        what: &'static str,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Zeroizing<String>, OAuthError> {
        let Some(source) = &self.settings.assertion else {
            return Err(OAuthError::Config {
                server: self.server.clone(),
                problem: format!(
                    "the {} grant needs where its {what} comes from (a file or a command) in [mcp.servers.NAME] auth.oauth",
                    self.settings.grant.as_str()
                ),
            });
        };
        source
            .read(what, ASSERTION_COMMAND_TIMEOUT, signal)
            .await
            .map_err(|problem| match problem {
                Problem::Cancelled => OAuthError::Cancelled {
                    server: self.server.clone(),
                },
                Problem::Unreadable(problem) => OAuthError::AssertionUnavailable {
                    server: self.server.clone(),
                    what,
                    problem,
                },
            })
    }
}

/// `text` from a server, unless it quotes a part of `jwt` (a server that echoes the
/// assertion it refused would put it in our error): then a note that it was withheld.
pub(crate) fn withheld_if_quoting(text: String, jwt: &str) -> String {
    let quotes = jwt
        .split('.')
        .filter(|part| part.len() >= 16)
        .any(|part| text.contains(&part[..16]));
    if quotes {
        "[withheld: the answer quoted the JWT]".into()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_text_that_quotes_the_jwt_is_withheld() {
        let jwt =
            "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzaWdpbC13b3JrbG9hZCJ9.c2lnbmF0dXJlLXNpZ2lsLTRlOGE";
        let cut = format!("bad assertion {}", &jwt[..60]);
        assert_eq!(
            withheld_if_quoting(cut, jwt),
            "[withheld: the answer quoted the JWT]"
        );
        let signature = format!("signature {} invalid", jwt.rsplit('.').next().unwrap());
        assert!(withheld_if_quoting(signature, jwt).starts_with("[withheld"));
        assert_eq!(
            withheld_if_quoting("the assertion has expired".into(), jwt),
            "the assertion has expired"
        );
    }

    #[test]
    fn the_jwt_bearer_form_carries_the_assertion_scopes_and_resource() {
        let form = jwt_bearer_form("h.p.s", &["mcp:read".into()], "https://mcp.example/mcp");
        assert_eq!(
            form,
            vec![
                (
                    "grant_type",
                    "urn:ietf:params:oauth:grant-type:jwt-bearer".to_string()
                ),
                ("assertion", "h.p.s".to_string()),
                ("scope", "mcp:read".to_string()),
                ("resource", "https://mcp.example/mcp".to_string()),
            ]
        );
        let bare = jwt_bearer_form("h.p.s", &[], "https://r");
        assert!(bare.iter().all(|(n, _)| *n != "scope"), "no empty scope");
    }

    #[test]
    fn each_leg_is_named_with_what_to_check() {
        for leg in [
            AssertionLeg::IdentityProvider,
            AssertionLeg::WorkloadAssertion,
            AssertionLeg::IdJag,
        ] {
            assert!(leg.advice().starts_with("check "));
        }
        assert!(
            AssertionLeg::IdentityProvider
                .to_string()
                .contains("identity provider")
        );
        assert!(
            AssertionLeg::IdJag
                .to_string()
                .contains("authorization server")
        );
    }
}
