//! O5: `serve` speaks TLS with `[serve] tls_cert` and `tls_key`: a client that trusts the
//! certificate's authority gets answers over HTTPS, plain HTTP gets nothing, and a broken
//! configuration is refused at start saying what to fix.

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use runwarden_testkit::{TestServer, mcp_handler, tool};
use serde_json::json;

use crate::support::serve::install;
use crate::support::{Live, runwarden};

/// A throwaway authority and a certificate for 127.0.0.1 and localhost it signed: the
/// authority's PEM, the server's chain PEM and the server's key PEM.
fn authority_and_server() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca_cert.pem(), server.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_over_tls_a_client_that_trusts_its_authority() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let (authority, chain, key) = authority_and_server();
    std::fs::write(sandbox.path().join("cert.pem"), chain).unwrap();
    std::fs::write(sandbox.path().join("key.pem"), key).unwrap();
    sandbox.append_config("[serve]\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n");
    let (serve, ready) = crate::support::serve_api(&sandbox).await;
    let url = ready["url"].as_str().unwrap().to_string();
    assert!(url.starts_with("https://127.0.0.1:"), "{ready}");

    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(authority.as_bytes()).unwrap())
        .build()
        .unwrap();
    let answer = trusting.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(answer.status(), 200);

    // A client that does not trust the authority is refused by its own TLS check.
    let stranger = reqwest::Client::new();
    let refused = stranger.get(format!("{url}/healthz")).send().await;
    assert!(refused.is_err(), "an untrusted certificate was accepted");
    // Plain HTTP on the TLS port gets no API answer.
    let plain = url.replacen("https://", "http://", 1);
    let plain = trusting.get(format!("{plain}/healthz")).send().await;
    assert!(
        plain.is_err() || plain.is_ok_and(|r| r.status() != 200),
        "plain HTTP was served on the TLS port"
    );
    serve.signal("TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_tls_configuration_is_refused_at_start_saying_what_to_fix() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let base = std::fs::read_to_string(sandbox.config()).unwrap();
    let (_, chain, _) = authority_and_server();
    let (_, _, other_key) = authority_and_server();
    std::fs::write(sandbox.path().join("cert.pem"), &chain).unwrap();
    std::fs::write(sandbox.path().join("other.pem"), other_key).unwrap();
    std::fs::write(sandbox.path().join("junk.pem"), "not a pem file").unwrap();
    for (serve_section, says) in [
        (
            "tls_cert = \"cert.pem\"\n",
            "[serve] tls_cert and tls_key go together",
        ),
        (
            "tls_cert = \"cert.pem\"\ntls_key = \"missing.pem\"\n",
            "[serve] tls_key",
        ),
        (
            "tls_cert = \"junk.pem\"\ntls_key = \"other.pem\"\n",
            "holds no certificate",
        ),
        (
            "tls_cert = \"cert.pem\"\ntls_key = \"other.pem\"\n",
            "do not make a usable pair",
        ),
    ] {
        std::fs::write(
            sandbox.config(),
            format!("{base}\n[serve]\n{serve_section}"),
        )
        .unwrap();
        let out = runwarden(&sandbox, &["serve", "--listen", "127.0.0.1:0"])
            .await
            .fails()
            .says(says);
        assert!(!out.all().contains("PRIVATE KEY"), "{out:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_a_non_loopback_address_is_served_with_a_warning() {
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let mut serve = Live::start(
        &sandbox,
        &["serve", "--listen", "0.0.0.0:0", "--concurrency", "0"],
    );
    let ready = serve.line().await;
    assert!(ready.starts_with("listening on http://0.0.0.0:"), "{ready}");
    let warning = serve.err_line().await;
    assert!(
        warning.contains("WARN")
            && warning.contains("plain HTTP on a non-loopback address")
            && warning.contains("set [serve] tls_cert and tls_key"),
        "{warning}"
    );
    serve.signal("TERM");
}
