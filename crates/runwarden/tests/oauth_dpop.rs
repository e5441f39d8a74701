//! DPoP-bound OAuth tokens (RFC 9449), end to end: the real binary against the testkit's
//! authorization server made to require DPoP and hand out nonces, and a protected MCP
//! server that checks a proof of the token's key on every request. The key is sealed in
//! the vault beside its token: a second process uses the same token, a refresh proves the
//! same key, and the private key appears in no output, log or database page.

use runwarden_testkit::{ClientSpec, Knobs};
use serde_json::Value;

use crate::oauth::{auth_status, contains, lookup, sandbox, server_toml, servers};
use crate::support::runwarden;

/// The base64url (and base64: no `+` or `/` in it) of the fixed PKCS#8 header of every
/// P-256 private key as ring writes it, the form the vault seals: seen anywhere in clear,
/// a DPoP private key leaked.
const PKCS8_P256_B64: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg";

/// The same header as DER bytes.
const PKCS8_P256_DER: &[u8] = &[
    0x30, 0x81, 0x87, 0x02, 0x01, 0x00, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02,
    0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x04, 0x6d, 0x30, 0x6b, 0x02,
    0x01, 0x01, 0x04, 0x20,
];

const OAUTH: &str = "grant = \"client_credentials\", client_id = \"agent\", client_secret = \"cc-secret\", auth_method = \"client_secret_post\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpop_bound_token_proves_its_key_on_every_request_across_processes_and_a_refresh() {
    let (auth, resource) = servers(Knobs {
        dpop: true,
        dpop_required: true,
        dpop_nonces: true,
        refresh_for_client_credentials: true,
        ..Knobs::default()
    })
    .await;
    auth.register(ClientSpec::secret_post("agent", "cc-secret-post"));
    let sandbox = sandbox(&server_toml("srv", &resource.resource, OAUTH));
    let mut outputs = vec![sandbox.put("cc-secret", "cc-secret-post")];
    let traced = |args: &[&str]| {
        let mut command = sandbox.command(args);
        command.env("RUNWARDEN_LOG", "trace");
        let sandbox = sandbox.clone();
        tokio::task::spawn_blocking(move || sandbox.run_command(command))
    };

    // The first process: a nonce from the token endpoint, then one from the MCP server.
    outputs.push(
        traced(&[
            "mcp",
            "call",
            "srv",
            "srv__lookup",
            "--args",
            r#"{"q":"printer"}"#,
        ])
        .await
        .unwrap()
        .ok()
        .says(r#"lookup {"q":"printer"}"#),
    );
    let counters = auth.counters();
    assert_eq!(counters.issued("client_credentials"), 1, "{counters:#?}");
    assert!(counters.dpop_token_proofs >= 2, "{counters:#?}");
    assert!(
        counters.dpop_nonce_challenges >= 2,
        "both servers asked for a nonce: {counters:#?}"
    );
    let (out, status) = auth_status(&sandbox).await;
    let jkt = status["dpop_jkt"]
        .as_str()
        .unwrap_or_else(|| panic!("a DPoP-bound token: {out:#?}"))
        .to_string();
    let token = auth.access_tokens().pop().unwrap();
    assert_eq!(
        auth.token(&token).unwrap().jkt.as_deref(),
        Some(jkt.as_str())
    );

    // A second process finds the token and its key in the vault: no new token.
    outputs.push(lookup(&sandbox).await);
    assert_eq!(auth.counters().issued("client_credentials"), 1);

    // New nonces and a dead token: the refresh proves the same key and the call goes on.
    auth.rotate_dpop_nonces();
    auth.expire_access_tokens();
    outputs.push(
        traced(&["mcp", "call", "srv", "srv__lookup", "--args", "{}"])
            .await
            .unwrap()
            .ok(),
    );
    let counters = auth.counters();
    assert_eq!(counters.refreshes, 1, "{counters:#?}");
    let (_, status) = auth_status(&sandbox).await;
    assert_eq!(status["dpop_jkt"], Value::from(jkt.clone()), "the same key");

    // The server saw the DPoP scheme and a valid proof of the token's key on every request
    // that carried a token.
    let carried: Vec<_> = auth
        .hits_on(&resource.resource)
        .into_iter()
        .filter(|h| h.bearer.is_some())
        .collect();
    assert!(carried.len() >= 6, "{carried:#?}");
    for hit in &carried {
        assert_eq!(hit.scheme.as_deref(), Some("DPoP"), "{hit:#?}");
        assert_eq!(hit.dpop, Some(Ok(jkt.clone())), "{hit:#?}");
    }
    assert!(carried.iter().filter(|h| h.status == 200).count() >= 3);
    let text = runwarden(&sandbox, &["mcp", "auth", "status"]).await.ok();
    assert!(text.stdout.contains("DPoP-bound"), "{text:#?}");
    outputs.push(text);
    outputs.push(runwarden(&sandbox, &["--json", "audit", "list"]).await.ok());

    // The private key is a secret: in no output, trace log, audit row or database page.
    assert!(
        outputs.iter().any(|o| o.stderr.contains("TRACE")),
        "the trace logs were really looked at"
    );
    for out in &outputs {
        assert!(!out.all().contains(PKCS8_P256_B64), "printed by {out:#?}");
    }
    let mut scanned = 0;
    for entry in std::fs::read_dir(sandbox.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        scanned += bytes.len();
        for needle in [PKCS8_P256_B64.as_bytes(), PKCS8_P256_DER] {
            assert!(
                !contains(&bytes, needle),
                "{} holds a DPoP private key in clear",
                path.display()
            );
        }
    }
    assert!(scanned > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpop_false_keeps_bearer_tokens_where_the_server_offers_dpop() {
    let (auth, resource) = servers(Knobs {
        dpop: true,
        ..Knobs::default()
    })
    .await;
    auth.register(ClientSpec::secret_post("agent", "cc-secret-post"));
    let sandbox = sandbox(&server_toml(
        "srv",
        &resource.resource,
        &format!("{OAUTH}, dpop = false"),
    ));
    sandbox.put("cc-secret", "cc-secret-post");
    lookup(&sandbox).await;
    let counters = auth.counters();
    assert_eq!(counters.dpop_token_proofs, 0, "{counters:#?}");
    for hit in auth.hits_on(&resource.resource) {
        assert_eq!(hit.dpop, None, "{hit:#?}");
        if hit.bearer.is_some() {
            assert_eq!(hit.scheme.as_deref(), Some("Bearer"), "{hit:#?}");
        }
    }
    let (out, status) = auth_status(&sandbox).await;
    assert_eq!(status["access_token"], true, "{out:#?}");
    assert!(status["dpop_jkt"].is_null(), "{out:#?}");
}
