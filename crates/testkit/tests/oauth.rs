//! The OAuth 2.1 authorization server and its protected resources, driven with plain
//! reqwest: discovery documents parse, every grant works, refresh tokens rotate, and each
//! refusal the vault's client must cope with happens.

use std::collections::HashMap;
use std::time::Duration;

use runwarden_testkit::{
    AuthServer, ClientSpec, HttpReply, JWT_BEARER_ASSERTION, Knobs, SigningKey, TestServer,
    mcp_handler, pkce_challenge, tool,
};
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(10);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a reqwest client")
}

async fn get_json(url: &str) -> (u16, Value) {
    let answer = client().get(url).send().await.expect("the GET is answered");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn token_request(
    server: &AuthServer,
    form: &[(&str, &str)],
    basic: Option<(&str, &str)>,
) -> (u16, Value) {
    let mut request = client().post(server.token_endpoint()).form(form);
    if let Some((id, secret)) = basic {
        request = request.basic_auth(id, Some(secret));
    }
    let answer = request.send().await.expect("the token endpoint answers");
    let status = answer.status().as_u16();
    (status, answer.json().await.expect("a JSON token answer"))
}

async fn call(resource: &str, bearer: Option<&str>) -> reqwest::Response {
    let mut request = client().post(resource).json(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"
    }));
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    request.send().await.expect("the resource answers")
}

fn mcp() -> impl Fn(&runwarden_testkit::HttpRequest) -> HttpReply + Send + Sync + 'static {
    mcp_handler(vec![tool("lookup")], &[])
}

#[tokio::test]
async fn discovery_documents_name_the_issuer_and_every_endpoint() {
    let server = AuthServer::start().await;
    let resource = server.protect("/mcp", &["mcp:read"], mcp()).await;
    let issuer = server.issuer();
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ] {
        let (status, document) = get_json(&server.url(path)).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(document["issuer"], json!(issuer), "{path}");
        assert_eq!(document["token_endpoint"], json!(format!("{issuer}/token")));
        assert_eq!(
            document["authorization_endpoint"],
            json!(format!("{issuer}/authorize"))
        );
        assert_eq!(
            document["registration_endpoint"],
            json!(format!("{issuer}/register"))
        );
        assert_eq!(
            document["code_challenge_methods_supported"],
            json!(["S256"])
        );
        assert_eq!(
            document["authorization_response_iss_parameter_supported"],
            json!(true)
        );
    }
    let (status, jwks) = get_json(&server.url("/jwks")).await;
    assert_eq!((status, jwks), (200, json!({"keys": []})));

    // RFC 9728: an unauthenticated call is challenged with the metadata's URL and scope.
    let answer = call(&resource.resource, None).await;
    assert_eq!(answer.status().as_u16(), 401);
    let challenge = answer.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        challenge,
        format!(
            "Bearer resource_metadata=\"{}\", scope=\"mcp:read\"",
            resource.metadata_url
        )
    );
    for url in [
        resource.metadata_url.clone(),
        resource
            .resource
            .replace("/mcp", "/.well-known/oauth-protected-resource"),
    ] {
        let (status, document) = get_json(&url).await;
        assert_eq!(status, 200, "{url}");
        assert_eq!(document["resource"], json!(resource.resource));
        assert_eq!(document["authorization_servers"], json!([issuer]));
        assert_eq!(document["scopes_supported"], json!(["mcp:read"]));
    }
    let counters = server.counters();
    assert_eq!(counters.metadata_requests.values().sum::<usize>(), 4);
    assert_eq!(server.hits().len(), 1, "the metadata requests are not hits");
}

#[tokio::test]
async fn client_credentials_with_each_secret_method_yield_a_token_the_resource_accepts() {
    let server = AuthServer::start().await;
    let resource = server.protect("/mcp", &["mcp:read"], mcp()).await;
    server.register(ClientSpec::secret_basic("basic-client", "basic secret:é"));
    server.register(ClientSpec::secret_post("post-client", "post-secret"));

    let (status, basic) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("scope", "mcp:read"),
            ("resource", &resource.resource),
        ],
        Some(("basic-client", "basic secret:é")),
    )
    .await;
    assert_eq!(status, 200, "{basic}");
    assert_eq!(basic["token_type"], "Bearer");
    assert_eq!(basic["expires_in"], 3600);
    assert_eq!(basic["scope"], "mcp:read");
    assert!(basic.get("refresh_token").is_none(), "{basic}");
    let (status, post) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "post-client"),
            ("client_secret", "post-secret"),
            ("resource", &resource.resource),
        ],
        None,
    )
    .await;
    assert_eq!(status, 200, "{post}");

    for token in [&basic, &post] {
        let bearer = token["access_token"].as_str().unwrap();
        let answer = call(&resource.resource, Some(bearer)).await;
        assert_eq!(answer.status().as_u16(), 200);
        let body: Value = answer.json().await.unwrap();
        assert_eq!(
            body["result"]["tools"][0]["name"], "lookup",
            "the inner MCP server answered"
        );
    }
    let counters = server.counters();
    assert_eq!(counters.token_requests("client_credentials"), 2);
    assert_eq!(counters.issued("client_credentials"), 2);
    assert_eq!(counters.auth_methods["client_secret_basic"], 1);
    assert_eq!(counters.auth_methods["client_secret_post"], 1);
    let hits = server.hits_on(&resource.resource);
    assert_eq!(hits.len(), 2);
    assert_eq!(hits[0].bearer.as_deref(), basic["access_token"].as_str());
    assert_eq!(hits[0].status, 200);
}

#[tokio::test]
async fn a_wrong_secret_or_another_method_than_registered_is_refused() {
    let server = AuthServer::start().await;
    server.register(ClientSpec::secret_basic("basic-client", "right"));
    let (status, answer) = token_request(
        &server,
        &[("grant_type", "client_credentials")],
        Some(("basic-client", "wrong")),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    let (status, answer) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "basic-client"),
            ("client_secret", "right"),
        ],
        None,
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    assert!(
        answer["error_description"]
            .as_str()
            .unwrap()
            .contains("registered for client_secret_basic but used client_secret_post"),
        "{answer}"
    );
    let counters = server.counters();
    assert_eq!(counters.token_requests("client_credentials"), 2);
    assert_eq!(counters.issued("client_credentials"), 0);
}

#[tokio::test]
async fn private_key_jwt_accepts_rs256_and_es256_and_refuses_replays_and_foreign_keys() {
    let server = AuthServer::start().await;
    let resource = server.protect("/mcp", &[], mcp()).await;
    let rsa = SigningKey::rs256();
    let ec = SigningKey::es256();
    server.register(ClientSpec::private_key_jwt("rsa-client", &rsa));
    server.register(ClientSpec::private_key_jwt("ec-client", &ec));
    assert!(
        rsa.private_pem()
            .starts_with("-----BEGIN PRIVATE KEY-----\n")
    );

    let assertion_grant = |assertion: &str, client_id: &str| {
        vec![
            ("grant_type".to_string(), "client_credentials".to_string()),
            ("client_id".into(), client_id.into()),
            ("client_assertion_type".into(), JWT_BEARER_ASSERTION.into()),
            ("client_assertion".into(), assertion.into()),
            ("resource".into(), resource.resource.clone()),
        ]
    };
    let post = |form: Vec<(String, String)>| {
        let server_url = server.token_endpoint();
        async move {
            let answer = client().post(server_url).form(&form).send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.json::<Value>().await.unwrap())
        }
    };

    let rsa_assertion = rsa.client_assertion("rsa-client", &server.issuer());
    let (status, answer) = post(assertion_grant(&rsa_assertion, "rsa-client")).await;
    assert_eq!(status, 200, "{answer}");
    let bearer = answer["access_token"].as_str().unwrap();
    assert_eq!(
        call(&resource.resource, Some(bearer))
            .await
            .status()
            .as_u16(),
        200
    );
    let ec_assertion = ec.client_assertion("ec-client", &server.token_endpoint());
    let (status, answer) = post(assertion_grant(&ec_assertion, "ec-client")).await;
    assert_eq!(status, 200, "{answer}");

    // The same assertion twice: its jti was used.
    let (status, answer) = post(assertion_grant(&rsa_assertion, "rsa-client")).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    // Signed by a key the client never registered.
    let foreign = SigningKey::es256().client_assertion("ec-client", &server.issuer());
    let (status, answer) = post(assertion_grant(&foreign, "ec-client")).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    // Addressed to another audience.
    let elsewhere = ec.client_assertion("ec-client", "http://127.0.0.1:1/");
    let (status, answer) = post(assertion_grant(&elsewhere, "ec-client")).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );
    // Expired.
    let expired = ec.sign_jwt(&json!({
        "iss": "ec-client", "sub": "ec-client", "aud": server.issuer(), "exp": 1, "jti": "old"
    }));
    let (status, answer) = post(assertion_grant(&expired, "ec-client")).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("invalid_client"))
    );

    let counters = server.counters();
    assert_eq!(counters.issued("client_credentials"), 2);
    assert_eq!(counters.auth_methods["private_key_jwt"], 6);
    assert_eq!(counters.errors.len(), 4, "{:?}", counters.errors);
}

/// Runs an authorization request and answers the redirect's query parameters.
async fn authorize(
    server: &AuthServer,
    client_id: &str,
    redirect_uri: &str,
    verifier: &str,
    resource: &str,
) -> HashMap<String, String> {
    let answer = client()
        .get(server.url("/authorize"))
        .query(&[
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", redirect_uri),
            ("code_challenge", &pkce_challenge(verifier)),
            ("code_challenge_method", "S256"),
            ("state", "st-1"),
            ("scope", "mcp:read offline_access"),
            ("resource", resource),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 302);
    let location = answer.headers()["location"].to_str().unwrap();
    assert!(location.starts_with(redirect_uri), "{location}");
    url::Url::parse(location)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

#[tokio::test]
async fn authorization_code_with_pkce_redirects_to_the_loopback_listener_and_exchanges_once() {
    let server = AuthServer::start().await;
    let resource = server.protect("/mcp", &["mcp:read"], mcp()).await;
    // The loopback redirect listener a CLI login would open.
    let mut listener = TestServer::start(|_| HttpReply::text(200, "you may close this tab")).await;
    let redirect_uri = listener.url("/callback");
    // Registered without a port: a loopback redirect matches any port (RFC 8252).
    server.register(ClientSpec::public("cli", &["http://127.0.0.1/callback"]));

    // A plain client that follows redirects lands on the listener with the code.
    let verifier = "a-verifier-of-at-least-forty-three-characters-0123456789";
    let followed = reqwest::Client::new()
        .get(server.url("/authorize"))
        .query(&[
            ("response_type", "code"),
            ("client_id", "cli"),
            ("redirect_uri", redirect_uri.as_str()),
            ("code_challenge", &pkce_challenge(verifier)),
            ("code_challenge_method", "S256"),
            ("state", "st-1"),
            ("resource", resource.resource.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(followed.text().await.unwrap(), "you may close this tab");
    let landed = listener.next_request(WITHIN).await;
    let params: HashMap<String, String> = url::Url::parse(&format!("http://x{}", landed.target))
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(params["state"], "st-1");
    assert_eq!(params["iss"], server.issuer(), "RFC 9207");

    let exchange = |code: String, verifier: &'static str| {
        let form = vec![
            ("grant_type", "authorization_code".to_string()),
            ("client_id", "cli".into()),
            ("code", code),
            ("code_verifier", verifier.into()),
            ("redirect_uri", redirect_uri.clone()),
            ("resource", resource.resource.clone()),
        ];
        let url = server.token_endpoint();
        async move {
            let answer = client().post(url).form(&form).send().await.unwrap();
            (
                answer.status().as_u16(),
                answer.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, tokens) = exchange(params["code"].clone(), verifier).await;
    assert_eq!(status, 200, "{tokens}");
    assert!(tokens["refresh_token"].as_str().unwrap().starts_with("rt-"));
    let bearer = tokens["access_token"].as_str().unwrap();
    assert_eq!(
        call(&resource.resource, Some(bearer))
            .await
            .status()
            .as_u16(),
        200
    );
    // A code is single-use.
    let (status, again) = exchange(params["code"].clone(), verifier).await;
    assert_eq!(
        (status, again["error"].as_str()),
        (400, Some("invalid_grant"))
    );

    // A verifier that does not match the challenge is refused.
    let params = authorize(&server, "cli", &redirect_uri, verifier, &resource.resource).await;
    let (status, wrong) = exchange(params["code"].clone(), "another-verifier").await;
    assert_eq!(
        (status, wrong["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    assert!(
        wrong["error_description"]
            .as_str()
            .unwrap()
            .contains("code_verifier")
    );

    // Without PKCE the server redirects an error, with state and iss.
    let answer = client()
        .get(server.url("/authorize"))
        .query(&[
            ("response_type", "code"),
            ("client_id", "cli"),
            ("redirect_uri", redirect_uri.as_str()),
            ("state", "st-2"),
        ])
        .send()
        .await
        .unwrap();
    let location = answer.headers()["location"].to_str().unwrap();
    assert!(location.contains("error=invalid_request"), "{location}");
    assert!(location.contains("state=st-2"), "{location}");
    // An unregistered redirect URI is never redirected to.
    let answer = client()
        .get(server.url("/authorize"))
        .query(&[
            ("client_id", "cli"),
            ("redirect_uri", "http://evil.example/cb"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 400);
    assert!(answer.headers().get("location").is_none());
    let counters = server.counters();
    assert_eq!(counters.authorizations, 2);
    assert_eq!(counters.issued("authorization_code"), 1);
}

#[tokio::test]
async fn dynamic_registration_creates_clients_of_each_method() {
    let server = AuthServer::start().await;
    let answer = client()
        .post(server.url("/register"))
        .json(&json!({
            "client_name": "runwarden",
            "redirect_uris": ["http://127.0.0.1:5555/callback"],
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 201);
    let public: Value = answer.json().await.unwrap();
    assert!(public["client_id"].as_str().unwrap().starts_with("dyn-"));
    assert!(public.get("client_secret").is_none(), "{public}");
    assert_eq!(public["client_name"], "runwarden");

    let answer = client()
        .post(server.url("/register"))
        .json(&json!({"grant_types": ["client_credentials"]}))
        .send()
        .await
        .unwrap();
    let confidential: Value = answer.json().await.unwrap();
    assert_eq!(
        confidential["token_endpoint_auth_method"],
        "client_secret_basic"
    );
    let (id, secret) = (
        confidential["client_id"].as_str().unwrap(),
        confidential["client_secret"].as_str().unwrap(),
    );
    let (status, _) = token_request(
        &server,
        &[("grant_type", "client_credentials")],
        Some((id, secret)),
    )
    .await;
    assert_eq!(status, 200);

    let key = SigningKey::es256();
    let answer = client()
        .post(server.url("/register"))
        .json(&json!({
            "grant_types": ["client_credentials"],
            "token_endpoint_auth_method": "private_key_jwt",
            "jwks": {"keys": [key.public_jwk()]},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 201);
    let registered: Value = answer.json().await.unwrap();
    let id = registered["client_id"].as_str().unwrap();
    let assertion = key.client_assertion(id, &server.issuer());
    let (status, answer) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("client_assertion_type", JWT_BEARER_ASSERTION),
            ("client_assertion", &assertion),
        ],
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    // A code client without redirect URIs is refused.
    let answer = client()
        .post(server.url("/register"))
        .json(&json!({"token_endpoint_auth_method": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 400);
    assert_eq!(server.counters().registrations, 3);
    assert_eq!(server.clients().len(), 3);
}

#[tokio::test]
async fn refresh_tokens_rotate_and_a_reused_one_revokes_its_family() {
    let server = AuthServer::start().await;
    let resource = server.protect("/mcp", &[], mcp()).await;
    server.knobs(|k| {
        k.refresh_for_client_credentials = true;
        k.access_token_prefix = "SIGIL-AT-".into();
    });
    server.register(ClientSpec::secret_post("agent", "s"));
    let refresh = |token: String| {
        let url = server.token_endpoint();
        async move {
            let answer = client()
                .post(url)
                .form(&[
                    ("grant_type", "refresh_token"),
                    ("refresh_token", token.as_str()),
                    ("client_id", "agent"),
                    ("client_secret", "s"),
                ])
                .send()
                .await
                .unwrap();
            (
                answer.status().as_u16(),
                answer.json::<Value>().await.unwrap(),
            )
        }
    };
    let (_, first) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "agent"),
            ("client_secret", "s"),
            ("resource", &resource.resource),
        ],
        None,
    )
    .await;
    assert!(
        first["access_token"]
            .as_str()
            .unwrap()
            .starts_with("SIGIL-AT-")
    );
    let r1 = first["refresh_token"].as_str().unwrap().to_string();

    let (status, second) = refresh(r1.clone()).await;
    assert_eq!(status, 200, "{second}");
    let r2 = second["refresh_token"].as_str().unwrap().to_string();
    assert_ne!(r1, r2, "the refresh token rotated");
    // The refreshed access token keeps the resource binding.
    let bearer = second["access_token"].as_str().unwrap();
    assert_eq!(
        server.token(bearer).unwrap().audience.as_deref(),
        Some(resource.resource.as_str())
    );
    assert_eq!(
        call(&resource.resource, Some(bearer))
            .await
            .status()
            .as_u16(),
        200
    );

    // Presenting the rotated-out token again is reuse: refused, and r2 dies with it.
    let (status, reused) = refresh(r1).await;
    assert_eq!(
        (status, reused["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    let (status, after) = refresh(r2).await;
    assert_eq!(
        (status, after["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    let counters = server.counters();
    assert_eq!(counters.refreshes, 1);
    assert_eq!(counters.refresh_reuse, 1);
    assert_eq!(counters.token_requests("refresh_token"), 3);

    // A refresh delay holds the answer (decided at once) for that long.
    server.knobs(|k| k.refresh_delay = Duration::from_millis(300));
    let (_, held) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "agent"),
            ("client_secret", "s"),
        ],
        None,
    )
    .await;
    let started = std::time::Instant::now();
    let (status, _) = refresh(held["refresh_token"].as_str().unwrap().to_string()).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.knobs(|k| k.refresh_delay = Duration::ZERO);

    // Without rotation the same refresh token keeps working.
    server.knobs(|k| k.rotate_refresh_tokens = false);
    let (_, fresh) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "agent"),
            ("client_secret", "s"),
        ],
        None,
    )
    .await;
    let kept = fresh["refresh_token"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let (status, answer) = refresh(kept.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(answer["refresh_token"].as_str(), Some(kept.as_str()));
    }
}

#[tokio::test]
async fn a_token_bound_to_resource_a_is_refused_by_resource_b() {
    let server = AuthServer::start().await;
    let a = server.protect("/a", &[], mcp()).await;
    let b = server.protect("/b", &[], mcp()).await;
    server.register(ClientSpec::secret_basic("agent", "s"));
    let (_, for_a) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("resource", &a.resource),
        ],
        Some(("agent", "s")),
    )
    .await;
    let bearer = for_a["access_token"].as_str().unwrap();
    assert_eq!(call(&a.resource, Some(bearer)).await.status().as_u16(), 200);
    let refused = call(&b.resource, Some(bearer)).await;
    assert_eq!(refused.status().as_u16(), 401);
    let challenge = refused.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    assert!(challenge.contains(&b.metadata_url), "{challenge}");
    // A token bound to no resource is refused everywhere.
    let (_, unbound) = token_request(
        &server,
        &[("grant_type", "client_credentials")],
        Some(("agent", "s")),
    )
    .await;
    let unbound = unbound["access_token"].as_str().unwrap();
    assert_eq!(
        call(&a.resource, Some(unbound)).await.status().as_u16(),
        401
    );
    let on_b = server.hits_on(&b.resource);
    assert_eq!(on_b.len(), 1);
    assert_eq!(on_b[0].bearer.as_deref(), Some(bearer));
    assert_eq!(on_b[0].status, 401);
}

#[tokio::test]
async fn expired_tokens_are_refused_and_step_up_asks_for_the_missing_scope() {
    let server = AuthServer::start_with(Knobs {
        access_ttl: Duration::from_secs(2),
        ..Knobs::default()
    })
    .await;
    let resource = server.protect("/mcp", &["mcp:read"], mcp()).await;
    server.register(ClientSpec::secret_basic("agent", "s"));
    let (_, answer) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("scope", "mcp:read"),
            ("resource", &resource.resource),
        ],
        Some(("agent", "s")),
    )
    .await;
    assert_eq!(answer["expires_in"], 2);
    let bearer = answer["access_token"].as_str().unwrap();
    assert_eq!(
        call(&resource.resource, Some(bearer))
            .await
            .status()
            .as_u16(),
        200
    );

    server.knobs(|k| k.required_scope = Some("mcp:write".into()));
    let forbidden = call(&resource.resource, Some(bearer)).await;
    assert_eq!(forbidden.status().as_u16(), 403);
    let challenge = forbidden.headers()["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(
        challenge.contains("scope=\"mcp:read mcp:write\""),
        "{challenge}"
    );
    let (_, wider) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("scope", "mcp:read mcp:write"),
            ("resource", &resource.resource),
        ],
        Some(("agent", "s")),
    )
    .await;
    let wider = wider["access_token"].as_str().unwrap();
    assert_eq!(
        call(&resource.resource, Some(wider))
            .await
            .status()
            .as_u16(),
        200
    );

    // A withheld scope is never granted, so the step-up never satisfies the resource.
    server.knobs(|k| k.withheld_scopes = vec!["mcp:write".into()]);
    let (_, narrow) = token_request(
        &server,
        &[
            ("grant_type", "client_credentials"),
            ("scope", "mcp:read mcp:write"),
            ("resource", &resource.resource),
        ],
        Some(("agent", "s")),
    )
    .await;
    assert_eq!(narrow["scope"], "mcp:read");
    let narrow = narrow["access_token"].as_str().unwrap();
    assert_eq!(
        call(&resource.resource, Some(narrow))
            .await
            .status()
            .as_u16(),
        403
    );

    server.expire_access_tokens();
    assert!(server.token(wider).unwrap().expired());
    let expired = call(&resource.resource, Some(wider)).await;
    assert_eq!(expired.status().as_u16(), 401);
}

#[tokio::test]
async fn knobs_make_the_metadata_and_the_authorization_response_lie() {
    let server = AuthServer::start().await;
    let resource = server.protect("/mcp", &[], mcp()).await;
    server.knobs(|k| {
        k.metadata_issuer = Some("https://impostor.example".into());
        k.token_endpoint = Some("http://10.0.0.1/token".into());
        k.authorization_servers = Some(vec!["http://169.254.169.254".into()]);
        k.response_iss = Some("https://impostor.example".into());
        k.serve_openid_metadata = false;
    });
    let (_, document) = get_json(&server.url("/.well-known/oauth-authorization-server")).await;
    assert_eq!(document["issuer"], "https://impostor.example");
    assert_eq!(document["token_endpoint"], "http://10.0.0.1/token");
    let (status, _) = get_json(&server.url("/.well-known/openid-configuration")).await;
    assert_eq!(status, 404);
    let (_, prm) = get_json(&resource.metadata_url).await;
    assert_eq!(
        prm["authorization_servers"],
        json!(["http://169.254.169.254"])
    );

    server.register(ClientSpec::public("cli", &["http://127.0.0.1/cb"]));
    let params = authorize(
        &server,
        "cli",
        "http://127.0.0.1:9/cb",
        "v",
        &resource.resource,
    )
    .await;
    assert_eq!(params["iss"], "https://impostor.example");
    server.knobs(|k| k.omit_response_iss = true);
    let params = authorize(
        &server,
        "cli",
        "http://127.0.0.1:9/cb",
        "v",
        &resource.resource,
    )
    .await;
    assert!(params.contains_key("code"));
    assert!(!params.contains_key("iss"), "{params:?}");
}
