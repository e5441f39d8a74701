//! The OpenAI-compatible provider against a fake chat completions server (L1).

use runwarden_models::{ModelProvider, OpenAiCompatible, ToolCallRequest};
use runwarden_testkit::TestServer;
use serde_json::json;

use crate::support::{KEY_SIGIL, WAIT, body_of, fixture, hello, json_reply, second_round};

fn answer_text(text: &str) -> serde_json::Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
    ]})
}

#[tokio::test]
async fn openai_request_carries_messages_tools_and_the_key_as_bearer() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| json_reply(200, answer_text("Both filed."))).await;
    let mut model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1/"), "gpt-test");
    model.api_key = Some(f.put_key("openai").await);
    model.max_tokens = Some(256);
    model.stream = false;

    let turn = model.complete(&second_round(), None).await.unwrap();
    assert_eq!(turn.text.as_deref(), Some("Both filed."));
    assert!(turn.tool_calls.is_empty());

    let seen = server.next_request(WAIT).await;
    assert_eq!(seen.method, "POST");
    assert_eq!(
        seen.target, "/v1/chat/completions",
        "a trailing slash on base_url is tolerated"
    );
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {KEY_SIGIL}").as_str())
    );
    assert_eq!(seen.header("content-type"), Some("application/json"));
    let body = body_of(&seen);
    assert_eq!(
        body,
        json!({
            "model": "gpt-test",
            "stream": false,
            "max_tokens": 256,
            "messages": [
                {"role": "system", "content": "You file tickets."},
                {"role": "user", "content": "File two tickets."},
                {"role": "assistant", "content": "Filing them.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "tickets__create", "arguments": "{\"title\":\"one\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "tickets__create", "arguments": "{\"title\":\"two\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "created T-1"},
                {"role": "tool", "tool_call_id": "c2", "content": "quota exceeded"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "tickets__create",
                "description": "Opens a ticket",
                "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
            }}],
        })
    );

    // V7: an intent and one completion row naming it, by the model actor, with the run as
    // correlation and no key.
    let rows = f.audit().await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].event.action, "http_call_started");
    assert_eq!(rows[1].event.intent_id, Some(rows[0].id));
    let row = &rows[1].event;
    assert_eq!(row.action, "http_call");
    assert_eq!(row.actor, "model");
    assert_eq!(row.correlation.as_deref(), Some("run-42"));
    assert_eq!(row.reason.as_deref(), Some("model openai gpt-test"));
    assert_eq!(row.secret.as_deref(), Some("openai"));
}

#[tokio::test]
async fn openai_without_a_key_sends_no_authorization_and_omits_empty_tools() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| json_reply(200, answer_text("hi"))).await;
    let model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "llama3");
    // A server that ignores `"stream": true` and answers JSON is read as JSON.
    let turn = model.complete(&hello(), None).await.unwrap();
    assert_eq!(turn.text.as_deref(), Some("hi"));

    let seen = server.next_request(WAIT).await;
    assert_eq!(seen.header("authorization"), None);
    let body = body_of(&seen);
    assert!(body.get("tools").is_none(), "{body}");
    assert_eq!(
        body["max_tokens"], 4096,
        "L5: the default cap is sent: {body}"
    );
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "Hello"}])
    );
}

#[tokio::test]
async fn openai_tool_calls_are_parsed_with_json_arguments() {
    let f = fixture().await;
    let server = TestServer::start(|_| {
        json_reply(
            200,
            json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "tickets__create", "arguments": "{\"title\": \"Printer on fire\", \"priority\": 1}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "tickets__search", "arguments": "{}"}},
                ],
            }}]}),
        )
    })
    .await;
    let model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "gpt-test");

    let turn = model.complete(&hello(), None).await.unwrap();
    assert_eq!(turn.text, None);
    assert_eq!(
        turn.tool_calls,
        vec![
            ToolCallRequest {
                id: "call_a".into(),
                name: "tickets__create".into(),
                arguments: json!({"title": "Printer on fire", "priority": 1}),
                invalid_arguments: None,
            },
            ToolCallRequest {
                id: "call_b".into(),
                name: "tickets__search".into(),
                arguments: json!({}),
                invalid_arguments: None,
            },
        ]
    );
}

#[tokio::test]
async fn openai_invalid_json_arguments_are_marked_for_a_tool_error_not_a_failed_turn() {
    let f = fixture().await;
    let server = TestServer::start(|_| {
        json_reply(
            200,
            json!({"choices": [{"message": {"tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "tickets__create", "arguments": "{\"title\": "}}
            ]}}]}),
        )
    })
    .await;
    let model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "gpt-test");

    let turn = model.complete(&hello(), None).await.unwrap();
    let call = &turn.tool_calls[0];
    assert_eq!(call.name, "tickets__create");
    assert_eq!(
        call.arguments,
        serde_json::Value::Null,
        "L4: never a silent {{}}"
    );
    assert!(
        call.invalid_arguments
            .as_deref()
            .is_some_and(|why| why.contains("EOF while parsing")),
        "{call:?}"
    );
}

#[tokio::test]
async fn a_request_cap_lowers_max_tokens_on_the_wire_and_never_raises_it() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| json_reply(200, answer_text("ok"))).await;
    let mut model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "gpt-test");
    model.max_tokens = Some(256);
    model.stream = false;
    for (cap, sent) in [(Some(11), 11), (Some(5_000), 256), (None, 256)] {
        let mut request = hello();
        request.max_tokens = cap;
        model.complete(&request, None).await.unwrap();
        let body = body_of(&server.next_request(WAIT).await);
        assert_eq!(body["max_tokens"], sent, "cap {cap:?}");
    }
}
