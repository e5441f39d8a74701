//! The Anthropic provider against a fake Messages server (L1).

use runwarden_models::{Anthropic, ModelProvider, ToolCallRequest};
use runwarden_testkit::TestServer;
use serde_json::json;

use crate::support::{KEY_SIGIL, WAIT, body_of, fixture, hello, json_reply, second_round};

fn answer() -> serde_json::Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "tickets__search", "input": {"q": "printer"}},
    ]})
}

async fn provider(f: &crate::support::Fixture, server: &TestServer) -> Anthropic {
    let mut model = Anthropic::new(
        f.egress.clone(),
        "claude-test",
        f.put_key("anthropic").await,
    );
    model.base_url = server.url("/v1");
    // These answers are whole JSON documents: the non-streamed path.
    model.stream = false;
    model
}

#[tokio::test]
async fn anthropic_tool_results_are_merged_into_one_user_message() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| json_reply(200, answer())).await;
    let model = provider(&f, &server).await;

    let turn = model.complete(&second_round(), None).await.unwrap();
    assert_eq!(turn.text.as_deref(), Some("Let me check."));
    assert_eq!(
        turn.tool_calls,
        vec![ToolCallRequest {
            id: "toolu_1".into(),
            name: "tickets__search".into(),
            arguments: json!({"q": "printer"}),
            invalid_arguments: None,
        }]
    );

    let seen = server.next_request(WAIT).await;
    assert_eq!(seen.target, "/v1/messages");
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        body_of(&seen),
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "stream": false,
            "system": "You file tickets.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "File two tickets."}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Filing them."},
                    {"type": "tool_use", "id": "c1", "name": "tickets__create", "input": {"title": "one"}},
                    {"type": "tool_use", "id": "c2", "name": "tickets__create", "input": {"title": "two"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "created T-1", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "quota exceeded", "is_error": true},
                ]},
            ],
            "tools": [{
                "name": "tickets__create",
                "description": "Opens a ticket",
                "input_schema": {"type": "object", "properties": {"title": {"type": "string"}}},
            }],
        })
    );
    let rows = f.audit().await;
    assert_eq!(
        rows[0].event.reason.as_deref(),
        Some("model anthropic claude-test")
    );
}

#[tokio::test]
async fn anthropic_key_goes_in_x_api_key() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| {
        json_reply(200, json!({"content": [{"type": "text", "text": "Hi."}]}))
    })
    .await;
    let model = provider(&f, &server).await;

    let turn = model.complete(&hello(), None).await.unwrap();
    assert_eq!(turn.text.as_deref(), Some("Hi."));
    assert!(turn.tool_calls.is_empty());

    let seen = server.next_request(WAIT).await;
    assert_eq!(seen.header("x-api-key"), Some(KEY_SIGIL));
    assert_eq!(seen.header("authorization"), None);
    let body = body_of(&seen);
    assert!(
        body.get("tools").is_none() && body.get("system").is_none(),
        "{body}"
    );
}

#[tokio::test]
async fn a_request_cap_lowers_anthropic_max_tokens_and_never_raises_it() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| json_reply(200, answer())).await;
    let model = provider(&f, &server).await;
    for (cap, sent) in [(Some(11), 11), (Some(9_000), 4096), (None, 4096)] {
        let mut request = hello();
        request.max_tokens = cap;
        model.complete(&request, None).await.unwrap();
        let body = body_of(&server.next_request(WAIT).await);
        assert_eq!(body["max_tokens"], sent, "cap {cap:?}");
    }
}
