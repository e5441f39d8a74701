//! The assertion grants end to end: the real binary against the testkit's authorization
//! server, its enterprise identity provider and a protected MCP server on 127.0.0.1.
//! `jwt_bearer` (workload identity federation, RFC 7523) with the JWT in a file that
//! rotates; `cross_app_access` (enterprise-managed authorization) with the ID token from a
//! command, exchanged at the identity provider for an ID-JAG, then the JWT bearer grant.
//! Every leg is audited; no JWT or client secret appears in any output, log or audit row;
//! a refusal names its leg and is not retried.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{
    AuthServer, ClientSpec, Knobs, ProtectedResource, SigningKey, TestIdentityProvider,
};
use serde_json::json;

use crate::oauth::{
    auth_status, contains, lookup, only_its_own_tokens_reached, sandbox, server_toml, servers,
};
use crate::support::{Live, Output, Sandbox, runwarden};

/// The grant type the authorization server counts JWT bearer requests under.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// The issuer of the workload's JWTs (a platform's token service).
const WORKLOAD_ISSUER: &str = "https://workload-issuer.example";

/// A workload JWT for `subject`, addressed to `audience`, expiring `ttl` seconds from now
/// (negative: already expired).
fn workload_jwt(key: &SigningKey, subject: &str, audience: &str, ttl: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    key.sign_jwt(&json!({
        "iss": WORKLOAD_ISSUER, "sub": subject, "aud": audience,
        "iat": now, "exp": now + ttl, "jti": format!("{subject}-{now}"),
    }))
}

/// An authorization server that trusts the workload issuer's `key`, its MCP server, and a
/// sandbox whose `srv` uses the `jwt_bearer` grant with the JWT in `workload.jwt`.
async fn workload_setup(key: &SigningKey) -> (AuthServer, ProtectedResource, Arc<Sandbox>) {
    let (auth, resource) = servers(Knobs::default()).await;
    auth.trust_issuer(WORKLOAD_ISSUER, key.public_jwk());
    auth.register(ClientSpec::public("workload", &[]));
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        "grant = \"jwt_bearer\", client_id = \"workload\", assertion_file = \"workload.jwt\"",
    ));
    (auth, resource, sandbox)
}

/// Runs `args` with trace logs, so the scans below see every log line.
async fn traced(sandbox: &Arc<Sandbox>, args: &[&str]) -> Output {
    let mut command = sandbox.command(args);
    command.env("RUNWARDEN_LOG", "trace");
    let sandbox = sandbox.clone();
    tokio::task::spawn_blocking(move || sandbox.run_command(command))
        .await
        .unwrap()
}

/// Asserts none of `secrets` is in any of `outputs`, the audit log, or the data files.
async fn appears_nowhere(sandbox: &Arc<Sandbox>, mut outputs: Vec<Output>, secrets: &[String]) {
    for args in [
        vec!["--json", "audit", "list"],
        vec!["audit", "list"],
        vec!["--json", "mcp", "auth", "status"],
    ] {
        outputs.push(runwarden(sandbox, &args).await.ok());
    }
    assert!(
        outputs
            .iter()
            .any(|o| o.stderr.contains("TRACE") || o.stderr.contains("DEBUG")),
        "the trace logs were really looked at"
    );
    for secret in secrets {
        // A JWT's signature alone is what makes it usable; look for that too.
        let needles = [secret.as_str(), secret.rsplit('.').next().unwrap_or(secret)];
        for out in &outputs {
            for needle in needles {
                assert!(!out.all().contains(needle), "printed by {out:#?}");
            }
        }
        for entry in std::fs::read_dir(sandbox.data_dir()).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !contains(&bytes, needles[1].as_bytes()),
                "{} holds a JWT or secret in clear",
                path.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_jwt_from_a_file_buys_a_token_and_the_rotated_file_is_read_for_the_next() {
    let key = SigningKey::es256();
    let (auth, resource, sandbox) = workload_setup(&key).await;
    let first = workload_jwt(&key, "workload-1", &auth.issuer(), 600);
    std::fs::write(sandbox.path().join("workload.jwt"), format!("{first}\n")).unwrap();
    let mut outputs = vec![
        traced(&sandbox, &["mcp", "import", "srv"]).await.ok(),
        lookup(&sandbox).await,
    ];
    let counters = auth.counters();
    assert_eq!(counters.issued(JWT_BEARER), 1, "{counters:#?}");
    assert_eq!(counters.assertion_subjects, ["workload-1"]);
    only_its_own_tokens_reached(&auth, &resource);

    // The platform rotates the file; the server drops the token: the renewal presents the
    // new JWT, read from the file again.
    let second = workload_jwt(&key, "workload-2", &auth.issuer(), 600);
    std::fs::write(sandbox.path().join("workload.jwt"), &second).unwrap();
    auth.expire_access_tokens();
    outputs.push(lookup(&sandbox).await);
    let counters = auth.counters();
    assert_eq!(
        counters.assertion_subjects,
        ["workload-1", "workload-2"],
        "{counters:#?}"
    );
    assert!(counters.errors.is_empty(), "{counters:#?}");

    let (out, status) = auth_status(&sandbox).await;
    assert_eq!(status["grant"], "jwt_bearer", "{out:#?}");
    let file = sandbox.path().join("workload.jwt");
    assert_eq!(
        status["assertion_source"],
        json!(format!("file {}", file.display()))
    );
    assert_eq!(status["access_token"], true);
    runwarden(&sandbox, &["mcp", "auth", "status"])
        .await
        .ok()
        .says("grant jwt_bearer, JWT from file");
    appears_nowhere(&sandbox, outputs, &[first, second]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_app_access_exchanges_the_id_token_for_an_id_jag_then_calls_with_the_token() {
    let idp = TestIdentityProvider::start().await;
    let (auth, resource) = servers(Knobs::default()).await;
    let app_secret = "xaa-sigil-app-secret-71c2".to_string();
    let idp_secret = "xaa-sigil-idp-secret-0d4b".to_string();
    auth.register(ClientSpec::secret_basic("app", &app_secret));
    auth.trust_issuer(&idp.issuer(), idp.jag_jwk());
    idp.register("idp-app", Some(&idp_secret), "app");
    let id_token = idp.id_token("alice", "idp-app");
    let servers_toml = server_toml(
        "srv",
        &resource.resource,
        &format!(
            "grant = \"cross_app_access\", client_id = \"app\", client_secret = \"app-secret\", \
             id_token_command = [\"sh\", \"-c\", \"test -z \\\"$RUNWARDEN_LOG\\\" && cat id-token.jwt\"], \
             idp_token_endpoint = \"{}\", \
             idp_client_id = \"idp-app\", idp_client_secret = \"idp-secret\"",
            idp.token_endpoint()
        ),
    );
    let sandbox = sandbox(&servers_toml);
    // The command runs in the working directory of the process (the sandbox), and fails if
    // it sees runwarden's own variables (the traced runs below set RUNWARDEN_LOG).
    std::fs::write(sandbox.path().join("id-token.jwt"), &id_token).unwrap();
    let mut outputs = vec![
        sandbox.put("app-secret", &app_secret),
        sandbox.put("idp-secret", &idp_secret),
    ];
    outputs.push(traced(&sandbox, &["mcp", "import", "srv"]).await.ok());
    outputs.push(lookup(&sandbox).await);
    outputs.push(
        traced(&sandbox, &["run", "--agent", "a", "find the printer"])
            .await
            .ok()
            .says("tool srv__lookup succeeded"),
    );

    // The identity provider's leg: one RFC 8693 exchange for the authorization server and
    // the MCP server, with the IdP client's own secret.
    let exchanges = idp.exchanges();
    assert_eq!(
        exchanges.len(),
        1,
        "one token for every process: {exchanges:#?}"
    );
    let exchange = &exchanges[0];
    assert_eq!(exchange.status, 200, "{exchange:#?}");
    assert_eq!(exchange.basic_client.as_deref(), Some("idp-app"));
    assert_eq!(exchange.form["audience"], auth.issuer());
    assert_eq!(exchange.form["resource"], resource.resource);
    assert_eq!(exchange.form["subject_token"], id_token);
    assert_eq!(exchange.form["scope"], "mcp:read");
    // The authorization server's leg: the ID-JAG in a JWT bearer grant, once.
    let counters = auth.counters();
    assert_eq!(counters.issued(JWT_BEARER), 1, "{counters:#?}");
    assert_eq!(counters.assertion_subjects, ["alice"]);
    assert_eq!(counters.auth_methods.get("client_secret_basic"), Some(&1));
    only_its_own_tokens_reached(&auth, &resource);

    // Each leg is an `oauth_token` audit row: one to the identity provider, one to the
    // authorization server.
    let rows = runwarden(
        &sandbox,
        &["--json", "audit", "list", "--action", "oauth_token"],
    )
    .await
    .ok()
    .json();
    let hosts: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["host"].as_str().unwrap_or_default().to_string())
        .collect();
    let host_of = |url: &str| url::Url::parse(url).unwrap().port().unwrap().to_string();
    for (leg, url) in [
        ("identity provider", idp.issuer()),
        ("authorization server", auth.issuer()),
    ] {
        assert!(
            hosts.iter().any(|h| h.contains(&host_of(&url))),
            "the {leg} leg is audited: {rows:#}"
        );
    }

    let (out, status) = auth_status(&sandbox).await;
    assert_eq!(status["grant"], "cross_app_access", "{out:#?}");
    assert_eq!(status["identity_provider"], json!(idp.token_endpoint()));
    assert_eq!(status["assertion_source"], "command sh");
    let jag = exchange.issued.clone().unwrap();
    appears_nowhere(&sandbox, outputs, &[id_token, jag, app_secret, idp_secret]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_leg_is_named_with_what_to_check_and_never_retried() {
    // The identity provider refuses the ID token: the authorization server is never asked.
    let idp = TestIdentityProvider::start().await;
    let (auth, resource) = servers(Knobs::default()).await;
    auth.register(ClientSpec::secret_basic("app", "app-secret-value"));
    auth.trust_issuer(&idp.issuer(), idp.jag_jwk());
    idp.register("idp-app", None, "app");
    idp.refuse(Some(("invalid_grant", "the ID token was revoked")));
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        &format!(
            "grant = \"cross_app_access\", client_id = \"app\", client_secret = \"app-secret\", \
             id_token_file = \"id-token.jwt\", idp_token_endpoint = \"{}\", idp_client_id = \"idp-app\"",
            idp.token_endpoint()
        ),
    ));
    sandbox.put("app-secret", "app-secret-value");
    let id_token = idp.id_token("alice", "idp-app");
    std::fs::write(sandbox.path().join("id-token.jwt"), &id_token).unwrap();
    let out = runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .fails()
        .says("the identity provider's token exchange for an ID-JAG failed: invalid_grant (the ID token was revoked); check");
    assert!(!out.all().contains(&id_token), "{out:#?}");
    assert_eq!(
        idp.exchanges().len(),
        1,
        "not retried: {:#?}",
        idp.exchanges()
    );
    assert_eq!(auth.counters().token_requests(JWT_BEARER), 0);
    // A public IdP client names itself in the form.
    assert_eq!(idp.exchanges()[0].form["client_id"], "idp-app");

    // The authorization server refuses an expired workload JWT: one request, no retry,
    // no other grant tried.
    let key = SigningKey::es256();
    let (auth, _resource, sandbox) = workload_setup(&key).await;
    let expired = workload_jwt(&key, "workload-1", &auth.issuer(), -60);
    std::fs::write(sandbox.path().join("workload.jwt"), &expired).unwrap();
    let out = runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .fails()
        .says("the authorization server's JWT bearer grant failed: invalid_grant (the assertion has expired); check that the assertion is current");
    assert!(!out.all().contains(&expired), "{out:#?}");
    let counters = auth.counters();
    assert_eq!(counters.token_requests(JWT_BEARER), 1, "{counters:#?}");
    assert_eq!(
        counters.token_requests.values().sum::<usize>(),
        1,
        "{counters:#?}"
    );

    // A missing file is named, and nothing is sent.
    std::fs::remove_file(sandbox.path().join("workload.jwt")).unwrap();
    runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .fails()
        .says("no assertion to present: cannot read the file");
    assert_eq!(auth.counters().token_requests(JWT_BEARER), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_the_identity_provider_exchange_closes_it_on_the_wire() {
    const WAIT: Duration = Duration::from_secs(15);
    let mut idp = TestIdentityProvider::start().await;
    let (auth, resource) = servers(Knobs::default()).await;
    auth.register(ClientSpec::secret_basic("app", "app-secret-value"));
    idp.register("idp-app", None, "app");
    idp.stall(true);
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        &format!(
            "grant = \"cross_app_access\", client_id = \"app\", client_secret = \"app-secret\", \
             id_token_file = \"id-token.jwt\", idp_token_endpoint = \"{}\", idp_client_id = \"idp-app\"",
            idp.token_endpoint()
        ),
    ));
    sandbox.put("app-secret", "app-secret-value");
    std::fs::write(
        sandbox.path().join("id-token.jwt"),
        idp.id_token("alice", "idp-app"),
    )
    .unwrap();
    let mut live = Live::start(&sandbox, &["mcp", "import", "srv"]);
    let request = idp.server.next_request(WAIT).await;
    assert!(
        String::from_utf8_lossy(&request.body).contains("token-exchange"),
        "the exchange is on the wire"
    );
    live.signal("INT");
    let signalled = Instant::now();
    idp.server.next_close(WAIT).await;
    let ended = live.ended(signalled, WAIT).await;
    assert_eq!(ended.code, Some(130), "{ended:#?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "the cancel tore the exchange down at once: {:?}",
        signalled.elapsed()
    );
    assert_eq!(auth.counters().token_requests(JWT_BEARER), 0);
    // The torn-down leg is audited as a cancelled call.
    let rows = runwarden(
        &sandbox,
        &["--json", "audit", "list", "--action", "http_call_cancelled"],
    )
    .await
    .ok()
    .json();
    let port = url::Url::parse(&idp.issuer())
        .unwrap()
        .port()
        .unwrap()
        .to_string();
    let leg = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["host"].as_str().unwrap_or_default().contains(&port))
        .unwrap_or_else(|| panic!("the identity provider's leg is audited: {rows:#}"));
    assert!(
        leg["reason"]
            .as_str()
            .is_some_and(|r| r.contains("ID-JAG at the identity provider")),
        "{leg:#}"
    );
}
