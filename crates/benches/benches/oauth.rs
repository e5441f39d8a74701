//! M18: what OAuth costs a `tools/call`. The same `McpClient` calls the same protected
//! MCP server (the testkit's authorization server and resource on 127.0.0.1) three ways:
//! with a static bearer secret (the baseline: an access token put in the vault as a plain
//! secret), with the OAuth token the OAuth client obtained and the vault holds (cached:
//! the sealed token record is read and placed each call), and with a token the server has just dropped
//! (the 401 path: a renewal at the token endpoint, then the call again). p50 and p99 of
//! each, and the ratios to the baseline, measured in one run.
//!
//! Run: `cargo bench -p runwarden-benches --bench oauth`.

use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_mcp::{McpCall, McpClient, ServerConfig};
use runwarden_oauth::{AuthMethod, Grant, OAuthSettings};
use runwarden_testkit::{
    AuthServer, ClientSpec, Dist, LoopbackVault, loopback_vault, mcp_handler, tool,
};
use runwarden_vault::{Credential, Placement, SecretName, SecretValue};
use serde_json::json;

const ITERATIONS: usize = 1_000;
const RENEWALS: usize = 200;

fn call() -> McpCall {
    McpCall {
        tool: "echo".into(),
        arguments: json!({"text": "hello"}).as_object().unwrap().clone(),
        correlation: None,
        gate: None,
        elicitor: None,
        output_schema: None,
        notices: None,
        ..Default::default()
    }
}

async fn timed(client: &McpClient, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let outcome = client.call_tool(call(), None).await;
        samples.push(started.elapsed());
        assert!(outcome.result.is_success(), "{:?}", outcome.result);
    }
    samples
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let auth = AuthServer::start().await;
    auth.register(ClientSpec::secret_basic("bench", "bench-secret"));
    let resource = auth
        .protect("/mcp", &["mcp:read"], mcp_handler(vec![tool("echo")], &[]))
        .await;
    let LoopbackVault {
        dir: _dir,
        vault,
        egress,
        ..
    } = loopback_vault().await;
    vault
        .secret_put(
            &SecretName::new("bench-client").unwrap(),
            SecretValue::new(b"bench-secret".to_vec()),
        )
        .await
        .unwrap();

    // OAuth: client credentials; the first call's 401 starts discovery and the grant.
    let mut settings = OAuthSettings::new(Grant::ClientCredentials);
    settings.client_id = Some("bench".into());
    settings.client_secret = Some(SecretName::new("bench-client").unwrap());
    settings.auth_method = Some(AuthMethod::ClientSecretBasic);
    let mut server = ServerConfig::new("bench", resource.resource.clone());
    server.oauth = Some(settings);
    let oauth = McpClient::new(server, egress.clone());

    // The baseline: the same server with a static bearer secret holding a token the
    // authorization server issued to a direct request.
    let form = format!(
        "grant_type=client_credentials&scope=mcp%3Aread&resource={}",
        url::form_urlencoded::byte_serialize(resource.resource.as_bytes()).collect::<String>()
    );
    let answer = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(auth.token_endpoint())
        .basic_auth("bench", Some("bench-secret"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    let token = answer["access_token"].as_str().unwrap().to_string();
    vault
        .secret_put(
            &SecretName::new("bench-static").unwrap(),
            SecretValue::new(token.into_bytes()),
        )
        .await
        .unwrap();
    let mut server = ServerConfig::new("bench-static", resource.resource.clone());
    server.auth = Some(Credential {
        secret: SecretName::new("bench-static").unwrap(),
        placement: Placement::Bearer,
    });
    let bearer = McpClient::new(server, egress);

    // Warm up both (OAuth's discovery and first grant happen here).
    timed(&oauth, 50).await;
    timed(&bearer, 50).await;
    let grants_before = auth.counters().token_requests("client_credentials");

    let mut static_bearer = Vec::new();
    let mut cached = Vec::new();
    // Interleaved rounds, so drift on a shared machine hits both alike.
    for _ in 0..4 {
        static_bearer.extend(timed(&bearer, ITERATIONS / 4).await);
        cached.extend(timed(&oauth, ITERATIONS / 4).await);
    }
    let (static_bearer, cached) = (Dist::new(static_bearer), Dist::new(cached));
    assert_eq!(
        auth.counters().token_requests("client_credentials"),
        grants_before,
        "a cached token is used, never renewed, while it is valid"
    );

    // The renewal path: the server drops the held token; the call's 401 renews it.
    let mut renewal = Vec::with_capacity(RENEWALS);
    for _ in 0..RENEWALS {
        auth.expire_access_tokens();
        let started = Instant::now();
        let outcome = oauth.call_tool(call(), None).await;
        renewal.push(started.elapsed());
        assert!(outcome.result.is_success(), "renewal: {:?}", outcome.result);
    }
    let renewal = Dist::new(renewal);
    assert_eq!(
        auth.counters().token_requests("client_credentials") - grants_before,
        RENEWALS,
        "one renewal per dropped token"
    );

    println!(
        "tools/call through McpClient to a bearer-protected MCP server on 127.0.0.1 ({ITERATIONS} calls each, {RENEWALS} renewals)"
    );
    println!("{:<46} {:>9} {:>9}", "", "p50 ms", "p99 ms");
    for (name, dist) in [
        ("static bearer secret (baseline)", &static_bearer),
        ("OAuth token held by the vault (cached)", &cached),
        ("OAuth after a 401: renew, then call again", &renewal),
    ] {
        println!(
            "{name:<46} {:>9.3} {:>9.3}",
            ms(dist.pct(50.0)),
            ms(dist.pct(99.0))
        );
    }
    println!(
        "cached OAuth / static bearer: p50 x{:.2}, p99 x{:.2}; renewal adds p50 {:.3} ms over a cached call",
        ms(cached.pct(50.0)) / ms(static_bearer.pct(50.0)),
        ms(cached.pct(99.0)) / ms(static_bearer.pct(99.0)),
        ms(renewal.pct(50.0)) - ms(cached.pct(50.0)),
    );
}
