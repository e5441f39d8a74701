//! V5, V7: bounded transfers and failure shapes, each with its intent and completion rows.

use std::time::Duration;

use runwarden_vault::audit::action;
use runwarden_vault::{EgressError, EgressRequest, Method};

use crate::support::fixture;
use runwarden_testkit::{HttpReply, TestServer};

#[tokio::test]
async fn a_server_that_never_answers_hits_the_total_timeout() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::Stall).await;
    let request =
        EgressRequest::new(Method::Get, server.url("/slow")).timeout(Duration::from_millis(300));
    let err = f.client.send(request, None).await.unwrap_err();
    assert!(matches!(err, EgressError::Timeout { .. }), "{err}");
    let row = f.completion_row().await;
    assert_eq!(
        (
            row.event.action.as_str(),
            row.event.success,
            row.event.status
        ),
        (action::HTTP_CALL, false, 0)
    );
    assert!(row.event.error.unwrap().contains("timed out"));
}

#[tokio::test]
async fn a_closed_port_is_a_transport_failure_with_a_one_line_error() {
    let f = fixture().await;
    let port = runwarden_testkit::closed_port();
    let request = EgressRequest::new(Method::Get, format!("http://127.0.0.1:{port}/x?token=abc"));
    let err = f.client.send(request, None).await.unwrap_err();
    assert!(matches!(err, EgressError::Transport { .. }), "{err}");
    let error = f.completion_row().await.event.error.unwrap();
    assert!(!error.contains('\n') && error.chars().count() <= 200);
    assert!(
        !error.contains("token=abc"),
        "queries are redacted: {error}"
    );
}

#[tokio::test]
async fn an_error_status_is_an_answer_the_caller_judges_and_the_audit_row_marks_failed() {
    let f = fixture().await;
    let server = TestServer::start({
        let reply = HttpReply::Respond {
            status: 503,
            headers: vec![],
            body: b"busy".to_vec(),
        };
        move |_| reply.clone()
    })
    .await;
    let response = f
        .client
        .send(EgressRequest::new(Method::Post, server.url("/")), None)
        .await
        .unwrap();
    assert_eq!(
        (
            response.status,
            response.is_success(),
            response.body.as_slice()
        ),
        (503, false, b"busy".as_slice())
    );
    let row = f.completion_row().await;
    assert_eq!(response.audit_id, Some(row.id));
    assert_eq!(
        (
            row.event.action.as_str(),
            row.event.status,
            row.event.success
        ),
        (action::HTTP_CALL, 503, false)
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_cut_and_the_rest_is_not_read() {
    let f = fixture().await;
    let body = vec![b'x'; 3 * 1024 * 1024];
    let server = TestServer::start({
        let reply = HttpReply::Respond {
            status: 200,
            headers: vec![],
            body,
        };
        move |_| reply.clone()
    })
    .await;
    let request =
        EgressRequest::new(Method::Get, server.url("/big")).max_response_bytes(2 * 1024 * 1024);
    let response = f.client.send(request, None).await.unwrap();
    assert!(response.truncated);
    assert_eq!(response.body.len(), 2 * 1024 * 1024);
}

#[tokio::test]
async fn a_caller_can_stop_reading_once_it_has_its_answer() {
    let f = fixture().await;
    let server = TestServer::start({
        let reply = HttpReply::Respond {
            status: 200,
            headers: vec![],
            body: b"first|second".to_vec(),
        };
        move |_| reply.clone()
    })
    .await;
    let request = EgressRequest::new(Method::Get, server.url("/"))
        .complete_when(Box::new(|body: &[u8]| body.contains(&b'|')));
    let response = f.client.send(request, None).await.unwrap();
    assert!(response.body.starts_with(b"first|"));
    assert!(!response.truncated);
}

#[tokio::test]
async fn every_call_that_reaches_the_network_writes_an_intent_and_a_completion_and_the_chain_verifies()
 {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    for _ in 0..5 {
        f.client
            .send(EgressRequest::new(Method::Get, server.url("/")), None)
            .await
            .unwrap();
    }
    f.client
        .send(EgressRequest::new(Method::Get, "http://10.0.0.1/"), None)
        .await
        .unwrap_err();
    // V7 (amended): five calls that reached the server, two rows each; one refusal, one row.
    let rows = f.audit().await;
    assert_eq!(rows.len(), 11);
    for pair in rows[..10].chunks(2) {
        assert_eq!(pair[0].event.action, action::HTTP_CALL_STARTED);
        assert_eq!(pair[1].event.action, action::HTTP_CALL);
        assert_eq!(pair[1].event.intent_id, Some(pair[0].id));
    }
    assert_eq!(rows[10].event.action, action::HTTP_CALL_REFUSED);
    assert_eq!(rows[10].event.intent_id, None);
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, 11);
    assert_eq!(report.incomplete_calls, 0);
}

#[tokio::test]
async fn the_head_observer_hears_the_status_while_the_body_is_still_open() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::event_stream(Vec::new(), true)).await;
    let (heard, head) = tokio::sync::oneshot::channel();
    let request = EgressRequest::new(Method::Get, server.url("/stream"))
        .timeout(Duration::from_secs(10))
        .on_head(Box::new(move |status| {
            let _ = heard.send(status);
        }));
    let flag = runwarden_vault::CancelFlag::new();
    let send = f.client.send(request, Some(&flag));
    let stop = async {
        // The body never ends: only the head can have told us.
        let status = tokio::time::timeout(Duration::from_secs(5), head)
            .await
            .expect("the head arrives before the body ends")
            .unwrap();
        flag.cancel();
        status
    };
    let (sent, status) = tokio::join!(send, stop);
    assert_eq!(status, 200);
    assert!(
        matches!(sent, Err(EgressError::CancelledInFlight { .. })),
        "{sent:?}"
    );
}
