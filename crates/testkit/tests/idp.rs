//! The enterprise identity provider and the authorization server's JWT bearer grant,
//! driven with plain reqwest: an ID token becomes an ID-JAG that buys a token bound to the
//! resource; an ID-JAG used twice, issued to another client or from an untrusted issuer,
//! and a bad ID token, are refused.

use runwarden_testkit::{AuthServer, ClientSpec, SigningKey, TestIdentityProvider};
use serde_json::Value;

const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

async fn post(url: &str, form: &[(&str, &str)], basic: Option<(&str, &str)>) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(url).form(form);
    if let Some((id, secret)) = basic {
        request = request.basic_auth(id, Some(secret));
    }
    let answer = request.send().await.expect("the token endpoint answers");
    let status = answer.status().as_u16();
    (status, answer.json().await.expect("a JSON answer"))
}

async fn exchange(idp: &TestIdentityProvider, id_token: &str, audience: &str) -> (u16, Value) {
    post(
        &idp.token_endpoint(),
        &[
            (
                "grant_type",
                "urn:ietf:params:oauth:grant-type:token-exchange",
            ),
            (
                "requested_token_type",
                "urn:ietf:params:oauth:token-type:id-jag",
            ),
            (
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:id_token",
            ),
            ("subject_token", id_token),
            ("audience", audience),
            ("resource", "http://127.0.0.1:9/mcp"),
        ],
        Some(("idp-app", "idp-secret")),
    )
    .await
}

#[tokio::test]
async fn an_id_token_becomes_an_id_jag_that_buys_one_token_for_its_client_and_resource() {
    let idp = TestIdentityProvider::start().await;
    let auth = AuthServer::start().await;
    idp.register("idp-app", Some("idp-secret"), "app");
    auth.register(ClientSpec::secret_basic("app", "app-secret"));
    auth.register(ClientSpec::secret_basic("other", "other-secret"));
    let id_token = idp.id_token("alice", "idp-app");

    let (status, answer) = exchange(&idp, &id_token, &auth.issuer()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["issued_token_type"],
        "urn:ietf:params:oauth:token-type:id-jag"
    );
    let jag = answer["access_token"].as_str().unwrap().to_string();
    let grant = |jag: String, client: (&'static str, &'static str)| {
        let token_endpoint = auth.token_endpoint();
        async move {
            post(
                &token_endpoint,
                &[("grant_type", JWT_BEARER), ("assertion", &jag)],
                Some(client),
            )
            .await
        }
    };

    // Before the IdP is trusted, its ID-JAG buys nothing.
    let (status, refused) = grant(jag.clone(), ("app", "app-secret")).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    auth.trust_issuer(&idp.issuer(), idp.jag_jwk());
    let (status, refused) = grant(jag.clone(), ("other", "other-secret")).await;
    assert_eq!(status, 400, "issued to app, not other: {refused}");
    let (status, token) = grant(jag.clone(), ("app", "app-secret")).await;
    assert_eq!(status, 200, "{token}");
    let issued = auth.token(token["access_token"].as_str().unwrap()).unwrap();
    assert_eq!(issued.audience.as_deref(), Some("http://127.0.0.1:9/mcp"));
    let (status, replayed) = grant(jag, ("app", "app-secret")).await;
    assert_eq!(status, 400, "an ID-JAG is used once: {replayed}");
    assert_eq!(auth.counters().issued(JWT_BEARER), 1);

    // An ID token the IdP did not sign, or for another client, is refused.
    let forged = SigningKey::es256().sign_jwt(&serde_json::json!({"sub": "mallory"}));
    let (status, _) = exchange(&idp, &forged, &auth.issuer()).await;
    assert_eq!(status, 400);
    let (status, _) = exchange(&idp, &idp.id_token("alice", "someone-else"), &auth.issuer()).await;
    assert_eq!(status, 400);
    assert_eq!(idp.exchanges().len(), 3);
}
