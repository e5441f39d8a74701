//! Error statuses and both cancellations, over the wire (R6, R9, V6).

use runwarden_models::{ModelError, ModelProvider, OpenAiCompatible};
use runwarden_testkit::{HttpReply, TestServer};
use runwarden_vault::CancelFlag;
use serde_json::json;

use crate::support::{KEY_SIGIL, WAIT, fixture, hello, json_reply};

#[tokio::test]
async fn a_429_is_retryable_and_a_401_is_not() {
    let f = fixture().await;
    let limited = TestServer::start(|_| {
        json_reply(
            429,
            json!({"error": {"message": "Rate limit reached\nfor gpt-test.\nTry again in 20s.", "type": "requests"}}),
        )
    })
    .await;
    let refused = TestServer::start(|_| {
        let long = format!(
            "Incorrect API key provided. {}",
            "Find your key in the dashboard. ".repeat(20)
        );
        json_reply(
            401,
            json!({"error": {"message": long, "type": "invalid_request_error"}}),
        )
    })
    .await;
    let key = f.put_key("openai").await;
    let mut model = OpenAiCompatible::new(f.egress.clone(), limited.url("/v1"), "gpt-test");
    model.api_key = Some(key);

    let error = model.complete(&hello(), None).await.unwrap_err();
    match &error {
        ModelError::Status { status, message } => {
            assert_eq!(*status, 429);
            assert_eq!(
                message,
                "Rate limit reached for gpt-test. Try again in 20s."
            );
        }
        other => panic!("expected a status error, got {other:?}"),
    }
    assert!(error.is_retryable(), "R9: a 429 requeues");

    model.base_url = refused.url("/v1");
    let error = model.complete(&hello(), None).await.unwrap_err();
    match &error {
        ModelError::Status { status, message } => {
            assert_eq!(*status, 401);
            assert!(
                message.starts_with("Incorrect API key provided."),
                "{message}"
            );
            assert!(
                message.chars().count() <= 200 && !message.contains('\n'),
                "{message}"
            );
        }
        other => panic!("expected a status error, got {other:?}"),
    }
    assert!(!error.is_retryable(), "R9: a 401 dead-letters");
    assert!(!error.to_string().contains(KEY_SIGIL));
}

#[tokio::test]
async fn a_stalled_model_call_is_torn_down_by_the_signal() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| HttpReply::Stall).await;
    let mut model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "gpt-test");
    model.api_key = Some(f.put_key("openai").await);
    let flag = CancelFlag::new();
    let request = hello();

    // `next_close` fails the test unless the server sees the connection close.
    let (outcome, _closed_at) = tokio::join!(model.complete(&request, Some(&flag)), async {
        server.next_request(WAIT).await;
        flag.cancel();
        server.next_close(WAIT).await
    });
    let error = outcome.unwrap_err();
    assert!(
        matches!(error, ModelError::Cancelled { in_flight: true }),
        "{error:?}"
    );
    assert!(error.is_cancelled() && !error.is_retryable());
    // V6: the key went out, so the row says the call was cancelled in flight.
    assert_eq!(f.audit_actions().await, ["http_call_cancelled"]);
}

#[tokio::test]
async fn a_signal_true_before_send_sends_nothing() {
    let f = fixture().await;
    let server = TestServer::start(|_| json_reply(200, json!({"choices": []}))).await;
    let mut model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "gpt-test");
    model.api_key = Some(f.put_key("openai").await);
    let flag = CancelFlag::new();
    flag.cancel();

    let error = model.complete(&hello(), Some(&flag)).await.unwrap_err();
    assert!(
        matches!(error, ModelError::Cancelled { in_flight: false }),
        "{error:?}"
    );
    assert_eq!(server.connection_count(), 0, "the server saw no connection");
    assert_eq!(f.audit_actions().await, ["http_call_cancelled_before_send"]);
}
