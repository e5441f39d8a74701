//! M18: OAuth 2.1 for MCP servers, end to end. The real binary against the testkit's real
//! authorization server and a protected MCP server on 127.0.0.1: client credentials with
//! each client authentication method, authorization code + PKCE through the loopback
//! redirect of `runwarden mcp login`, refresh with rotation across two processes, issuer
//! and `iss` checks, resource-bound tokens, the egress guard on metadata, and a sigil access
//! token that appears nowhere but on the wire.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{
    AuthServer, ClientSpec, Knobs, ProtectedResource, SigningKey, mcp_handler, tool,
};
use serde_json::{Value, json};

use crate::support::serve::{Api, Serve, token};
use crate::support::{Live, Output, Sandbox, runwarden};

/// A bound on a step that should take well under a second; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(15);

/// The scopes the protected MCP server asks for in its challenge.
const SCOPES: &[&str] = &["mcp:read"];

/// A plan that calls the server's one tool, then answers.
fn lookup_then_answer(server: &str) -> Value {
    json!([
        {"tool_calls": [{"name": format!("{server}__lookup"), "arguments": {"q": "printer"}}]},
        {"text": "Found it."}
    ])
}

/// `[mcp.servers.NAME]` at `url` with `auth = { oauth = { OAUTH } }`.
pub(crate) fn server_toml(name: &str, url: &str, oauth: &str) -> String {
    format!("\n[mcp.servers.{name}]\nurl = \"{url}\"\nauth = {{ oauth = {{ {oauth} }} }}\n")
}

/// An initialised sandbox that admits 127.0.0.1 (only: every other address stays behind
/// the egress guard), with `servers` appended and agent `a` replaying a lookup on `srv`.
pub(crate) fn sandbox(servers: &str) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        "{servers}\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n"
    ));
    std::fs::write(
        sandbox.path().join("plan.json"),
        lookup_then_answer("srv").to_string(),
    )
    .unwrap();
    Arc::new(sandbox)
}

/// An authorization server with `knobs`, and an MCP server (one tool, `lookup`) behind it.
pub(crate) async fn servers(knobs: Knobs) -> (AuthServer, ProtectedResource) {
    let auth = AuthServer::start_with(knobs).await;
    let resource = auth
        .protect("/mcp", SCOPES, mcp_handler(vec![tool("lookup")], &[]))
        .await;
    (auth, resource)
}

/// `mcp call srv srv__lookup`, which must succeed and show the tool's answer.
pub(crate) async fn lookup(sandbox: &Arc<Sandbox>) -> Output {
    runwarden(
        sandbox,
        &[
            "mcp",
            "call",
            "srv",
            "srv__lookup",
            "--args",
            r#"{"q":"printer"}"#,
        ],
    )
    .await
    .ok()
    .says(r#"lookup {"q":"printer"}"#)
}

/// `--json mcp auth status`: what the vault holds for `srv`.
pub(crate) async fn auth_status(sandbox: &Arc<Sandbox>) -> (Output, Value) {
    let out = runwarden(sandbox, &["--json", "mcp", "auth", "status"])
        .await
        .ok();
    let status = out.json()["servers"]
        .as_array()
        .and_then(|servers| servers.iter().find(|s| s["server"] == "srv").cloned())
        .unwrap_or_else(|| panic!("srv in the status: {out:#?}"));
    (out, status)
}

/// Asserts every request that reached `resource` with a bearer carried a token the
/// authorization server bound to that resource (RFC 8707), and that some did.
#[track_caller]
pub(crate) fn only_its_own_tokens_reached(auth: &AuthServer, resource: &ProtectedResource) {
    let hits = auth.hits_on(&resource.resource);
    let with_bearer: Vec<_> = hits.iter().filter(|h| h.bearer.is_some()).collect();
    assert!(!with_bearer.is_empty(), "no authorized request: {hits:#?}");
    for hit in with_bearer {
        let bearer = hit.bearer.as_deref().unwrap_or_default();
        let issued = auth
            .token(bearer)
            .unwrap_or_else(|| panic!("a bearer the server never issued: {hit:#?}"));
        assert_eq!(
            issued.audience.as_deref(),
            Some(resource.resource.as_str()),
            "{hit:#?}"
        );
    }
}

/// The first line either stream of `live` prints that holds an authorization URL.
async fn authorization_url(live: &mut Live, issuer: &str) -> (String, Vec<String>) {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = tokio::time::timeout(left, async {
            tokio::select! {
                Some(line) = live.stdout.recv() => line,
                Some(line) = live.stderr.recv() => line,
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no authorization URL printed in time; saw {seen:#?}"));
        let prefix = format!("{issuer}/authorize?");
        if let Some(at) = line.find(&prefix) {
            let url = line[at..]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            seen.push(line);
            return (url, seen);
        }
        seen.push(line);
    }
}

/// Opens an authorization URL as a browser would: follows the authorization server's
/// redirect to the loopback listener of `mcp login`.
async fn open_in_browser(url: &str) -> String {
    let answer = reqwest::Client::new()
        .get(url)
        .send()
        .await
        .expect("the authorization server and then the loopback listener answer");
    let landed = answer.url().to_string();
    let _ = answer.text().await;
    landed
}

/// `mcp login srv`: reads the printed URL, checks it asks for PKCE S256 and the resource,
/// opens it, and answers how the login ended with everything it printed.
async fn login(sandbox: &Arc<Sandbox>, auth: &AuthServer, resource: &str) -> (Option<i32>, String) {
    let since = Instant::now();
    let mut live = Live::start(sandbox, &["mcp", "login", "srv"]);
    let (url, mut printed) = authorization_url(&mut live, &auth.issuer()).await;
    let query: HashMap<String, String> = url::Url::parse(&url)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(query.get("response_type").map(String::as_str), Some("code"));
    assert_eq!(
        query.get("code_challenge_method").map(String::as_str),
        Some("S256"),
        "OAuth 2.1: PKCE with S256"
    );
    assert!(query.get("code_challenge").is_some_and(|c| c.len() >= 43));
    assert!(query.get("state").is_some_and(|s| !s.is_empty()));
    assert_eq!(
        query.get("resource").map(String::as_str),
        Some(resource),
        "RFC 8707: the resource indicator"
    );
    let landed = open_in_browser(&url).await;
    assert!(landed.starts_with("http://127.0.0.1:"), "{landed}");
    let ended = live.ended(since, WAIT * 2).await;
    printed.extend(ended.stdout);
    printed.extend(ended.stderr);
    (ended.code, printed.join("\n"))
}

/// A vault secret's name and value.
type Secret = (&'static str, String);

/// A change that makes the servers' metadata lie.
type Lie = fn(&mut Knobs);

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A client registered with `client_secret_basic` and an installation whose server `srv`
/// uses it through the client credentials grant, its secret in the vault.
fn client_credentials_sandbox(auth: &AuthServer, resource: &ProtectedResource) -> Arc<Sandbox> {
    auth.register(ClientSpec::secret_basic("agent", "cc-secret-basic"));
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        "grant = \"client_credentials\", client_id = \"agent\", client_secret = \"cc-secret\"",
    ));
    sandbox.put("cc-secret", "cc-secret-basic");
    sandbox
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_with_each_authentication_method_gets_one_token_for_every_process() {
    let es256 = SigningKey::es256();
    let rs256 = SigningKey::rs256();
    // (method, the client as registered, the vault secret it needs, the `oauth` table)
    let cases: Vec<(&str, ClientSpec, Secret, String)> = vec![
        (
            "client_secret_basic",
            ClientSpec::secret_basic("agent", "cc-secret-basic"),
            ("cc-secret", "cc-secret-basic".to_string()),
            "grant = \"client_credentials\", client_id = \"agent\", client_secret = \"cc-secret\", auth_method = \"client_secret_basic\"".into(),
        ),
        (
            "client_secret_post",
            ClientSpec::secret_post("agent", "cc-secret-post"),
            ("cc-secret", "cc-secret-post".to_string()),
            "grant = \"client_credentials\", client_id = \"agent\", client_secret = \"cc-secret\", auth_method = \"client_secret_post\"".into(),
        ),
        (
            "private_key_jwt",
            ClientSpec::private_key_jwt("agent", &es256),
            ("cc-key", es256.private_pem()),
            "grant = \"client_credentials\", client_id = \"agent\", private_key = \"cc-key\", auth_method = \"private_key_jwt\", signing_alg = \"ES256\"".into(),
        ),
        (
            "private_key_jwt",
            ClientSpec::private_key_jwt("agent", &rs256),
            ("cc-key", rs256.private_pem()),
            "grant = \"client_credentials\", client_id = \"agent\", private_key = \"cc-key\", auth_method = \"private_key_jwt\", signing_alg = \"RS256\"".into(),
        ),
    ];
    for (method, client, (secret_name, secret_value), oauth) in cases {
        let (auth, resource) = servers(Knobs::default()).await;
        auth.register(client);
        let sandbox = sandbox(&server_toml("srv", &resource.resource, &oauth));
        sandbox.put(secret_name, &secret_value);
        runwarden(&sandbox, &["mcp", "import", "srv"])
            .await
            .ok()
            .says("imported 1 tool");
        lookup(&sandbox).await;
        runwarden(&sandbox, &["run", "--agent", "a", "find the printer"])
            .await
            .ok()
            .says("tool srv__lookup succeeded");

        let counters = auth.counters();
        // V3: the token is a vault record every process shares; three processes, one token.
        assert_eq!(
            counters.issued("client_credentials"),
            1,
            "{method}: {counters:#?}"
        );
        assert_eq!(
            counters.auth_methods.get(method),
            Some(&1),
            "{method}: {counters:#?}"
        );
        assert_eq!(counters.registrations, 0, "a pre-registered client");
        only_its_own_tokens_reached(&auth, &resource);
        let calls = auth
            .hits_on(&resource.resource)
            .into_iter()
            .filter(|h| h.bearer.is_some() && h.status == 200)
            .count();
        assert!(calls >= 3, "{method}: {:#?}", auth.hits());

        // `mcp auth status` says what is held and until when, never the token.
        let (out, status) = auth_status(&sandbox).await;
        assert_eq!(status["grant"], "client_credentials", "{out:#?}");
        assert_eq!(status["issuer"], json!(auth.issuer()));
        assert_eq!(status["resource"], json!(resource.resource));
        assert_eq!(status["access_token"], true);
        assert!(status["expires_at_ms"].is_i64(), "{out:#?}");
        let text = runwarden(&sandbox, &["mcp", "auth", "status"]).await.ok();
        for issued in auth.access_tokens() {
            assert!(!out.all().contains(&issued) && !text.all().contains(&issued));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_code_with_pkce_logs_in_once_through_the_loopback_redirect() {
    let (auth, resource) = servers(Knobs::default()).await;
    // No client configured: the client registers itself (RFC 7591).
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        "grant = \"authorization_code\"",
    ));
    let (code, printed) = login(&sandbox, &auth, &resource.resource).await;
    assert_eq!(code, Some(0), "{printed}");

    let counters = auth.counters();
    assert_eq!(counters.registrations, 1, "{counters:#?}");
    assert_eq!(counters.authorizations, 1, "{counters:#?}");
    assert_eq!(counters.issued("authorization_code"), 1, "{counters:#?}");
    assert!(counters.errors.is_empty(), "{counters:#?}");

    // Later processes use the login's token: no new authorization, no new token.
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    lookup(&sandbox).await;
    runwarden(&sandbox, &["run", "--agent", "a", "find the printer"])
        .await
        .ok()
        .says("tool srv__lookup succeeded");
    let after = auth.counters();
    assert_eq!(after.authorizations, 1);
    assert_eq!(
        after.token_requests.values().sum::<usize>(),
        1,
        "{after:#?}"
    );
    only_its_own_tokens_reached(&auth, &resource);

    let (out, status) = auth_status(&sandbox).await;
    assert_eq!(status["grant"], "authorization_code", "{out:#?}");
    assert_eq!(status["registered"], true, "{out:#?}");
    assert_eq!(status["refresh_token"], true, "{out:#?}");
    for issued in auth.access_tokens() {
        assert!(!printed.contains(&issued) && !out.all().contains(&issued));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_answered_with_another_iss_or_none_is_refused_and_its_code_never_exchanged() {
    // RFC 9207: a mix-up attacker's response names another issuer, or drops the `iss` the
    // metadata promised.
    let lies: [(Lie, &str); 2] = [
        (
            |k| k.response_iss = Some("http://127.0.0.1:9/impostor".into()),
            "http://127.0.0.1:9/impostor",
        ),
        (|k| k.omit_response_iss = true, "lacks the iss parameter"),
    ];
    for (lie, said) in lies {
        let (auth, resource) = servers(Knobs::default()).await;
        auth.knobs(lie);
        let sandbox = sandbox(&server_toml(
            "srv",
            &resource.resource,
            "grant = \"authorization_code\"",
        ));
        let (code, printed) = login(&sandbox, &auth, &resource.resource).await;
        assert_ne!(code, Some(0), "{printed}");
        assert!(printed.contains("refused"), "{printed}");
        assert!(
            printed.contains("RFC 9207") && printed.contains(said),
            "{printed}"
        );
        let counters = auth.counters();
        assert_eq!(counters.authorizations, 1);
        assert_eq!(
            counters.token_requests("authorization_code"),
            0,
            "the code was never exchanged: {counters:#?}"
        );
        let (_, status) = auth_status(&sandbox).await;
        assert_eq!(status["access_token"], false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_across_two_processes_happens_once_and_both_keep_working() {
    let (auth, resource) = servers(Knobs::default()).await;
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        "grant = \"authorization_code\"",
    ));
    let (code, printed) = login(&sandbox, &auth, &resource.resource).await;
    assert_eq!(code, Some(0), "{printed}");
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    let before = auth.counters();
    let hits_before = auth.hits().len();
    // The server drops the held access token: every process that starts now gets a 401
    // and wants to renew it (the vault's renewal ahead of expiry takes the same path).
    // The token endpoint holds each refresh answer a second, so two processes that do
    // not wait for each other both send theirs for sure.
    auth.expire_access_tokens();
    auth.knobs(|k| k.refresh_delay = Duration::from_secs(1));

    // Two processes at once, both holding the dropped token.
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let sandbox = sandbox.clone();
            tokio::task::spawn_blocking(move || sandbox.run(&["run", "--agent", "a", "find it"]))
        })
        .collect();
    let mut outputs = Vec::new();
    for run in runs {
        outputs.push(run.await.unwrap());
    }
    let counters = auth.counters();
    assert_eq!(
        counters.refresh_reuse, 0,
        "a rotated-out refresh token was presented again: the refresh is not single-flight \
         across processes: {counters:#?}\n{outputs:#?}"
    );
    assert_eq!(
        counters.token_requests("refresh_token") - before.token_requests("refresh_token"),
        1,
        "one refresh for both processes: {counters:#?}"
    );
    for out in outputs {
        out.ok().says("tool srv__lookup succeeded");
    }
    // Both processes called the tool with the one refreshed token.
    let calls: Vec<String> = auth.hits_on(&resource.resource)[hits_before..]
        .iter()
        .filter(|h| h.status == 200)
        .filter_map(|h| h.bearer.clone())
        .collect();
    assert!(calls.len() >= 2, "{:#?}", auth.hits());
    assert!(calls.iter().all(|b| b == &calls[0]), "{calls:#?}");
    assert_eq!(
        auth.token(&calls[0]).map(|t| t.grant),
        Some("refresh_token".into())
    );

    // The rotated refresh token was saved: when the server drops the access token, the
    // next call refreshes with the new one and goes on.
    auth.knobs(|k| k.refresh_delay = Duration::ZERO);
    auth.expire_access_tokens();
    lookup(&sandbox).await;
    let last = auth.counters();
    assert_eq!(last.refreshes - before.refreshes, 2, "{last:#?}");
    assert_eq!(last.refresh_reuse, 0, "{last:#?}");
    assert!(last.errors.is_empty(), "{last:#?}");
    only_its_own_tokens_reached(&auth, &resource);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_naming_another_issuer_is_refused_before_any_token_request() {
    let (auth, resource) = servers(Knobs {
        metadata_issuer: Some("http://127.0.0.1:9/impostor".into()),
        ..Knobs::default()
    })
    .await;
    let sandbox = client_credentials_sandbox(&auth, &resource);
    let out = runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .fails()
        .says("issuer");
    assert!(
        out.all().contains("http://127.0.0.1:9/impostor"),
        "{out:#?}"
    );
    let counters = auth.counters();
    assert!(
        counters.metadata_requests.len() >= 2,
        "discovery ran: {counters:#?}"
    );
    assert_eq!(
        counters.token_requests.values().sum::<usize>(),
        0,
        "{counters:#?}"
    );
    assert!(auth.hits().iter().all(|h| h.bearer.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_resource_a_is_never_sent_to_resource_b() {
    let auth = AuthServer::start().await;
    let a = auth
        .protect("/mcp", SCOPES, mcp_handler(vec![tool("lookup")], &[]))
        .await;
    let b = auth
        .protect("/mcp", SCOPES, mcp_handler(vec![tool("lookup")], &[]))
        .await;
    auth.register(ClientSpec::secret_basic("agent", "cc-secret-basic"));
    let oauth =
        "grant = \"client_credentials\", client_id = \"agent\", client_secret = \"cc-secret\"";
    let sandbox = sandbox(&format!(
        "{}{}",
        server_toml("srv", &a.resource, oauth),
        server_toml("other", &b.resource, oauth)
    ));
    sandbox.put("cc-secret", "cc-secret-basic");
    for server in ["srv", "other"] {
        runwarden(&sandbox, &["mcp", "import", server]).await.ok();
    }
    for (server, tool) in [
        ("srv", "srv__lookup"),
        ("other", "other__lookup"),
        ("srv", "srv__lookup"),
    ] {
        runwarden(&sandbox, &["mcp", "call", server, tool, "--args", "{}"])
            .await
            .ok();
    }
    // One token per resource, each bound to its own, each only ever sent there.
    let counters = auth.counters();
    assert_eq!(counters.issued("client_credentials"), 2, "{counters:#?}");
    only_its_own_tokens_reached(&auth, &a);
    only_its_own_tokens_reached(&auth, &b);
    let refused: Vec<_> = auth
        .hits()
        .into_iter()
        .filter(|h| h.bearer.is_some() && h.status == 401)
        .collect();
    assert!(
        refused.is_empty(),
        "a token was refused somewhere: {refused:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_pointing_at_a_private_address_is_refused_by_the_egress_guard() {
    // 127.0.0.1 is allowlisted for the legitimate servers; these addresses are not.
    let lies: [(&str, Lie); 2] = [
        ("10.20.30.40", |k| {
            k.authorization_servers = Some(vec!["http://10.20.30.40".into()])
        }),
        ("169.254.169.254", |k| {
            k.token_endpoint = Some("http://169.254.169.254/token".into())
        }),
    ];
    for (host, lie) in lies {
        let (auth, resource) = servers(Knobs::default()).await;
        auth.knobs(lie);
        let sandbox = client_credentials_sandbox(&auth, &resource);
        let out = runwarden(&sandbox, &["mcp", "import", "srv"])
            .await
            .fails()
            .says("refused");
        assert!(out.all().contains(host), "{host}: {out:#?}");
        assert_eq!(
            auth.counters().issued("client_credentials"),
            0,
            "{host}: no token reached anyone"
        );
        // V4: the refusal is audited like any other refused target.
        let audit = runwarden(&sandbox, &["--json", "audit", "list"]).await.ok();
        assert!(audit.stdout.contains(host), "{host}: {audit:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigil_access_token_appears_in_no_output_log_event_api_answer_or_database_page() {
    const SIGIL: &str = "oauth-sigil-3c9a";
    let (auth, resource) = servers(Knobs {
        access_token_prefix: format!("{SIGIL}-access-"),
        refresh_token_prefix: format!("{SIGIL}-refresh-"),
        refresh_for_client_credentials: true,
        ..Knobs::default()
    })
    .await;
    let client_secret = format!("{SIGIL}-client-secret");
    auth.register(ClientSpec::secret_post("agent", &client_secret));
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        "grant = \"client_credentials\", client_id = \"agent\", client_secret = \"cc-secret\", auth_method = \"client_secret_post\"",
    ));
    let mut outputs = vec![sandbox.put("cc-secret", &client_secret)];
    let traced = |args: &[&str]| {
        let mut command = sandbox.command(args);
        command.env("RUNWARDEN_LOG", "trace");
        let sandbox = sandbox.clone();
        tokio::task::spawn_blocking(move || sandbox.run_command(command))
    };
    outputs.push(traced(&["mcp", "import", "srv"]).await.unwrap().ok());
    outputs.push(
        traced(&["mcp", "call", "srv", "srv__lookup", "--args", "{}"])
            .await
            .unwrap()
            .ok(),
    );
    let run = traced(&["--json", "run", "--agent", "a", "find it"])
        .await
        .unwrap()
        .ok();
    let run_id = serde_json::from_str::<Value>(run.stdout.lines().next().unwrap_or_default())
        .ok()
        .and_then(|first| first["run_id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("the run's id: {run:#?}"));
    outputs.push(run);
    // The server drops the token: the next run meets a 401 and refreshes.
    auth.expire_access_tokens();
    outputs.push(
        traced(&["run", "--agent", "a", "find it again"])
            .await
            .unwrap()
            .ok()
            .says("tool srv__lookup succeeded"),
    );
    for args in [
        vec!["events", run_id.as_str()],
        vec!["--json", "events", run_id.as_str()],
        vec!["--json", "status", run_id.as_str()],
        vec!["mcp", "auth", "status"],
        vec!["--json", "mcp", "auth", "status"],
        vec!["--json", "mcp", "list"],
        vec!["--json", "secret", "list"],
        vec!["audit", "list"],
        vec!["--json", "audit", "list"],
    ] {
        outputs.push(runwarden(&sandbox, &args).await.ok());
    }

    // The tokens reached the MCP server, refreshed once: the scans below are not vacuous.
    let counters = auth.counters();
    assert!(counters.refreshes >= 1, "{counters:#?}");
    let sent: Vec<String> = auth.hits().into_iter().filter_map(|h| h.bearer).collect();
    assert!(
        sent.iter().all(|b| b.starts_with(SIGIL)) && sent.len() >= 4,
        "{sent:?}"
    );
    assert!(
        outputs
            .iter()
            .any(|o| o.stderr.contains("TRACE") || o.stderr.contains("DEBUG")),
        "the trace logs were really looked at"
    );
    for out in &outputs {
        assert!(!out.all().contains(SIGIL), "printed by {out:#?}");
    }

    // The API, to a viewer; the database and its WAL while the server holds them open.
    let viewer = token(&sandbox, "viewer").await;
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);
    api.get("/v1/runs", &viewer).await;
    api.get(&format!("/v1/runs/{run_id}"), &viewer).await;
    api.get(&format!("/v1/runs/{run_id}/events"), &viewer).await;
    api.get("/v1/mcp/servers", &viewer).await;
    api.get("/v1/audit", &viewer).await;
    for body in api.bodies() {
        assert!(!body.contains(SIGIL), "an API answer: {body}");
    }
    let mut scanned = 0;
    for entry in std::fs::read_dir(sandbox.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        scanned += bytes.len();
        assert!(
            !contains(&bytes, SIGIL.as_bytes()),
            "{} holds a token or the client secret in clear",
            path.display()
        );
    }
    assert!(scanned > 0);
    drop(serve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_insufficient_scope_steps_up_to_the_named_scope_and_the_call_goes_through() {
    let (auth, resource) = servers(Knobs {
        required_scope: Some("mcp:write".into()),
        ..Knobs::default()
    })
    .await;
    let sandbox = client_credentials_sandbox(&auth, &resource);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    lookup(&sandbox).await;
    let hits = auth.hits();
    let forbidden = hits.iter().filter(|h| h.status == 403).count();
    assert_eq!(forbidden, 1, "one step-up, then the wider token: {hits:#?}");
    let last = hits.last().and_then(|h| h.bearer.as_deref()).unwrap();
    let issued = auth.token(last).unwrap();
    assert!(
        issued.scopes.iter().any(|s| s == "mcp:write")
            && issued.scopes.iter().any(|s| s == "mcp:read"),
        "the scopes of the challenge, kept and widened: {issued:#?}"
    );

    // A server that keeps asking for a scope the client is never granted is given up on
    // after the step-up limit, with an error that says so: no loop.
    auth.knobs(|k| {
        k.required_scope = Some("admin:everything".into());
        k.withheld_scopes = vec!["admin:everything".into()];
    });
    let before = auth.hits().len();
    runwarden(
        &sandbox,
        &["mcp", "call", "srv", "srv__lookup", "--args", "{}"],
    )
    .await
    .fails()
    .says("insufficient_scope");
    let refused = auth.hits()[before..]
        .iter()
        .filter(|h| h.status == 403)
        .count();
    assert!(
        (1..=3).contains(&refused),
        "at most the limit of step-ups: {:#?}",
        auth.hits()
    );
}
