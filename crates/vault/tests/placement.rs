//! V3: each placement puts the secret exactly where it belongs, and nowhere else.

use std::time::Duration;

use runwarden_vault::audit::action;
use runwarden_vault::{Credential, EgressRequest, Method, Placement};

use crate::support::{SIGIL, fixture};
use runwarden_testkit::{HttpReply, TestServer};

const WAIT: Duration = Duration::from_secs(10);

/// Sends one request with the sigil placed as `placement`; returns the raw request text.
async fn raw_request_with(placement: Placement) -> (String, crate::support::Fixture) {
    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let request = EgressRequest::new(Method::Post, server.url("/v1/things?page=2"))
        .body(b"{}".to_vec())
        .credential(Credential { secret, placement });
    let response = f.client.send(request, None).await.unwrap();
    assert_eq!(response.status, 200);
    (server.next_request(WAIT).await.raw, f)
}

fn lines_with_sigil(raw: &str, needle: &str) -> Vec<String> {
    raw.lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn bearer_goes_in_the_authorization_header_only() {
    let (raw, _f) = raw_request_with(Placement::Bearer).await;
    assert_eq!(
        lines_with_sigil(&raw, SIGIL),
        vec![format!("authorization: Bearer {SIGIL}")]
    );
}

#[tokio::test]
async fn basic_goes_base64_encoded_in_the_authorization_header_only() {
    use base64::Engine;
    let f = crate::support::fixture().await;
    let name = runwarden_vault::SecretName::new("basic").unwrap();
    f.vault
        .secret_put(
            &name,
            runwarden_vault::SecretValue::new(format!("user:{SIGIL}").into_bytes()),
        )
        .await
        .unwrap();
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let request = EgressRequest::new(Method::Get, server.url("/")).credential(Credential {
        secret: name,
        placement: Placement::Basic,
    });
    f.client.send(request, None).await.unwrap();
    let raw = server.next_request(WAIT).await.raw;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("user:{SIGIL}"));
    assert_eq!(
        lines_with_sigil(&raw, &encoded),
        vec![format!("authorization: Basic {encoded}")]
    );
    assert!(
        !raw.contains(SIGIL),
        "the plain value must not travel next to its encoding"
    );
}

#[tokio::test]
async fn a_named_header_carries_its_prefix_and_nothing_else_changes() {
    let placement = Placement::Header {
        name: "X-Api-Key".into(),
        prefix: Some("Token ".into()),
    };
    let (raw, _f) = raw_request_with(placement).await;
    assert_eq!(
        lines_with_sigil(&raw, SIGIL),
        vec![format!("x-api-key: Token {SIGIL}")]
    );
    assert!(!raw.to_ascii_lowercase().contains("authorization"));
}

#[tokio::test]
async fn a_query_placement_goes_in_the_request_line_only_and_not_in_the_audit_path() {
    let (raw, f) = raw_request_with(Placement::Query { name: "key".into() }).await;
    let request_line = raw.lines().next().unwrap().to_string();
    assert_eq!(lines_with_sigil(&raw, SIGIL), vec![request_line.clone()]);
    assert!(
        request_line.starts_with(&format!("POST /v1/things?page=2&key={SIGIL} ")),
        "{request_line}"
    );
    let row = f.completion_row().await;
    assert_eq!(row.event.path, "/v1/things");
    assert_eq!(row.event.secret.as_deref(), Some("api"));
    assert_eq!(row.event.action, action::HTTP_CALL);
    assert!(row.event.success);
}

#[tokio::test]
async fn a_placement_whose_value_has_a_line_break_is_refused_before_send() {
    let f = fixture().await;
    let name = runwarden_vault::SecretName::new("broken").unwrap();
    f.vault
        .secret_put(
            &name,
            runwarden_vault::SecretValue::new(b"abc\r\nX-Evil: 1".to_vec()),
        )
        .await
        .unwrap();
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let request = EgressRequest::new(Method::Get, server.url("/")).credential(Credential {
        secret: name,
        placement: Placement::Bearer,
    });
    let err = f.client.send(request, None).await.unwrap_err();
    assert!(err.to_string().contains("line break"), "{err}");
    assert!(!err.to_string().contains("X-Evil"));
    assert_eq!(
        server.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        f.only_audit_row().await.event.action,
        action::HTTP_CALL_REFUSED
    );
}

#[tokio::test]
async fn a_caller_header_with_a_line_break_is_refused_before_send() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let request = EgressRequest::new(Method::Get, server.url("/")).header("x-note", "a\r\nb: c");
    let err = f.client.send(request, None).await.unwrap_err();
    assert!(
        matches!(err, runwarden_vault::EgressError::InvalidHeader { .. }),
        "{err}"
    );
    assert_eq!(
        server.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        f.only_audit_row().await.event.action,
        action::HTTP_CALL_REFUSED
    );
}

#[tokio::test]
async fn a_missing_secret_is_refused_and_the_call_is_never_made_anonymously() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let secret = runwarden_vault::SecretName::new("absent").unwrap();
    let request = EgressRequest::new(Method::Get, server.url("/")).credential(Credential {
        secret,
        placement: Placement::Bearer,
    });
    let err = f.client.send(request, None).await.unwrap_err();
    assert!(
        err.to_string().contains("runwarden secret put absent"),
        "{err}"
    );
    assert_eq!(
        server.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    let row = f.only_audit_row().await;
    assert_eq!(
        (row.event.action.as_str(), row.event.secret.as_deref()),
        (action::HTTP_CALL_REFUSED, Some("absent"))
    );
}
