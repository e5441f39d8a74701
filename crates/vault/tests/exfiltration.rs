//! No secret leaves for a host it does not belong to: a request whose URL, headers or
//! body carry the value of any stored secret, in any spelling, is refused before a byte
//! is sent, with an audit row that names the secret and the destination.

use runwarden_testkit::{HttpReply, Spelling, TestServer};
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{
    Credential, Delivery, EgressError, EgressRequest, Method, Placement, SecretName, SecretValue,
};
use serde_json::json;

use crate::support::fixture;

const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const MODEL_KEY: &str = "sk-model-7d2c91aa";
const TICKETS: &str = "svc:tickets-pw-3e8f";

#[tokio::test]
async fn a_request_carrying_a_stored_secret_anywhere_is_refused_before_sending() {
    let f = fixture().await;
    for (name, value) in [("model-key", MODEL_KEY), ("tickets-basic", TICKETS)] {
        f.vault
            .secret_put(
                &SecretName::new(name).unwrap(),
                SecretValue::new(value.as_bytes().to_vec()),
            )
            .await
            .unwrap();
    }
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let own = || Credential {
        secret: SecretName::new("tickets-basic").unwrap(),
        placement: Placement::Basic,
    };
    let all_escaped = format!(
        r#"{{"arguments":{{"q":"{}"}}}}"#,
        Spelling::AllEscape.spell(MODEL_KEY)
    );
    let split_json = json!({"jsonrpc": "2.0", "params": {"arguments": {"text": format!("{{\"k\":\"{}\"}}", Spelling::OneEscape.spell(MODEL_KEY))}}}).to_string();
    let password = TICKETS.split_once(':').unwrap().1;
    let attempts: Vec<(&str, EgressRequest, &str)> = vec![
        (
            "the other server's key in the arguments, every character escaped",
            EgressRequest::new(Method::Post, server.url("/mcp"))
                .credential(own())
                .body(all_escaped),
            "model-key",
        ),
        (
            "JSON inside a JSON string",
            EgressRequest::new(Method::Post, server.url("/mcp")).body(split_json),
            "model-key",
        ),
        (
            "a URL parameter, percent-encoded",
            EgressRequest::new(
                Method::Get,
                server.url(&format!("/mcp?q={}", MODEL_KEY.replace('-', "%2d"))),
            ),
            "model-key",
        ),
        (
            "a header value",
            EgressRequest::new(Method::Post, server.url("/mcp")).header("x-note", MODEL_KEY),
            "model-key",
        ),
        (
            "the placed credential's own password, copied into the body",
            EgressRequest::new(Method::Post, server.url("/mcp"))
                .credential(own())
                .body(format!("{{\"q\":\"{password}\"}}")),
            "tickets-basic",
        ),
    ];
    for (what, request, secret) in attempts {
        let error = f.client.send(request, None).await.unwrap_err();
        assert!(
            matches!(&error, EgressError::SecretExfiltration { secrets, .. } if secrets == &[secret.to_string()]),
            "{what}: {error:?}"
        );
        assert_eq!(error.delivery(), Delivery::NotSent, "{what}");
        let text = error.to_string();
        assert!(
            text.contains("(secret_exfiltration)") && text.contains(secret),
            "{what}: {text}"
        );
        assert!(
            !text.contains(MODEL_KEY) && !text.contains(password),
            "{what}: {text}"
        );
    }
    // A clean call through the same client, placed where its placement says, goes out;
    // it is the only request the server ever saw.
    f.client
        .send(
            EgressRequest::new(Method::Post, server.url("/mcp"))
                .credential(own())
                .body("{}"),
            None,
        )
        .await
        .unwrap();
    let first = server.next_request(WAIT).await;
    assert_eq!(first.target, "/mcp");
    assert!(first.header("authorization").is_some());
    assert!(
        server.drain_requests().is_empty(),
        "nothing else reached the server"
    );

    let rows = f.vault.audit_list(AuditFilter::default()).await.unwrap();
    let refused: Vec<_> = rows
        .iter()
        .filter(|r| r.event.reason.as_deref() == Some("secret_exfiltration"))
        .collect();
    assert_eq!(refused.len(), 5, "{rows:?}");
    for row in &refused {
        assert_eq!(row.event.action, "http_call_refused");
        assert!(
            row.event.host.starts_with("127.0.0.1"),
            "{:?}",
            row.event.host
        );
        assert!(row.event.secret.is_some());
        assert!(
            row.event
                .error
                .as_deref()
                .is_some_and(|e| e.contains("secret_exfiltration"))
        );
    }
    let shown = format!("{rows:?}");
    assert!(
        !shown.contains(MODEL_KEY) && !shown.contains(password),
        "{shown}"
    );
}

#[tokio::test]
async fn a_secret_put_or_removed_while_the_client_runs_is_searched_for_at_once() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let send = |body: &'static str| {
        f.client.send(
            EgressRequest::new(Method::Post, server.url("/x")).body(body),
            None,
        )
    };
    assert!(send("late-secret-91ab").await.is_ok(), "not a secret yet");
    let name = SecretName::new("late").unwrap();
    f.vault
        .secret_put(&name, SecretValue::new(b"late-secret-91ab".to_vec()))
        .await
        .unwrap();
    assert!(matches!(
        send("late-secret-91ab").await,
        Err(EgressError::SecretExfiltration { .. })
    ));
    f.vault.secret_remove(&name).await.unwrap();
    assert!(send("late-secret-91ab").await.is_ok(), "no longer a secret");
}
