//! L3 over the wire: both providers stream from a real HTTP server on 127.0.0.1 through a
//! real vault; a cancel closes the open stream; a cut stream, a non-streamed answer, an
//! absent key and an echoed key.

use std::sync::Arc;

use runwarden_models::{
    Anthropic, FinishReason, ModelError, ModelProvider, ModelRequest, OpenAiCompatible, Progress,
    ToolCallRequest,
};
use runwarden_testkit::{HttpReply, TestServer};
use runwarden_vault::{CancelFlag, Delivery};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::{KEY_SIGIL, WAIT, body_of, fixture, hello, json_reply, second_round};

fn recorded(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A recorded stream as the server writes it: one chunk per event.
fn by_event(stream: &[u8]) -> Vec<Vec<u8>> {
    String::from_utf8(stream.to_vec())
        .unwrap()
        .split_inclusive("\n\n")
        .map(|event| event.as_bytes().to_vec())
        .collect()
}

#[tokio::test]
async fn a_streamed_openai_turn_arrives_whole_and_asks_for_usage() {
    let f = fixture().await;
    let stream = by_event(&recorded("openai_tools.sse"));
    let mut server =
        TestServer::start(move |_| HttpReply::event_stream(stream.clone(), false)).await;
    let mut model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "gpt-test");
    model.api_key = Some(f.put_key("openai").await);

    let turn = model.complete(&second_round(), None).await.unwrap();
    assert_eq!(turn.tool_calls.len(), 2);
    assert_eq!(turn.tool_calls[1].arguments, json!({"q": "caf\u{e9}"}));
    assert_eq!(turn.finish, Some(FinishReason::ToolCalls));
    assert_eq!(turn.usage.map(|u| u.input_tokens), Some(112));

    let seen = server.next_request(WAIT).await;
    assert_eq!(seen.header("accept"), Some("text/event-stream"));
    let body = body_of(&seen);
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}), "L5");
    assert_eq!(body["max_tokens"], 4096, "L5: the default cap");
    assert_eq!(f.audit_actions().await, ["http_call"]);
}

#[tokio::test]
async fn a_streamed_anthropic_turn_without_a_key_places_no_credential_and_names_the_version() {
    let f = fixture().await;
    let stream = by_event(&recorded("anthropic_tools.sse"));
    let mut server =
        TestServer::start(move |_| HttpReply::event_stream(stream.clone(), false)).await;
    let model = Anthropic::new(f.egress.clone(), "claude-test", None)
        .base_url(server.url("/v1"))
        .version("2099-01-01")
        .max_tokens(Some(64));

    let turn = model.complete(&hello(), None).await.unwrap();
    assert_eq!(turn.text.as_deref(), Some("Filing both."));
    assert_eq!(
        turn.tool_calls[0],
        ToolCallRequest::new(
            "toolu_01A",
            "tickets__create",
            json!({"title": "Printer \u{1f525}", "priority": 1})
        )
    );

    let seen = server.next_request(WAIT).await;
    assert_eq!(seen.header("x-api-key"), None, "no key, no credential");
    assert_eq!(seen.header("anthropic-version"), Some("2099-01-01"));
    assert_eq!(seen.header("accept"), Some("text/event-stream"));
    let body = body_of(&seen);
    assert_eq!(
        (body["stream"].clone(), body["max_tokens"].clone()),
        (json!(true), json!(64))
    );
    let rows = f.audit().await;
    assert!(rows.iter().all(|r| r.event.secret.is_none()), "{rows:?}");
}

/// The first events of a stream, then the server holds it open as a model would while it
/// generates.
fn open_stream(name: &str, events: usize) -> Vec<Vec<u8>> {
    by_event(&recorded(name)).into_iter().take(events).collect()
}

#[tokio::test]
async fn a_cancel_while_the_stream_is_open_closes_it_and_ends_cancelled_in_flight() {
    let f = fixture().await;
    let key = f.put_key("model-key").await;
    for (nth, provider) in ["openai", "anthropic"].into_iter().enumerate() {
        let fixture_name = format!("{provider}_text.sse");
        let head = open_stream(&fixture_name, 4);
        let mut server =
            TestServer::start(move |_| HttpReply::event_stream(head.clone(), true)).await;
        let model: Box<dyn ModelProvider> = if provider == "openai" {
            Box::new(
                OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "m")
                    .api_key(Some(key.clone())),
            )
        } else {
            Box::new(Anthropic::new(f.egress.clone(), "m", key.clone()).base_url(server.url("/v1")))
        };
        let (tx, mut deltas) = mpsc::unbounded_channel();
        let request = ModelRequest {
            progress: Some(Progress::new(move |n| {
                let _ = tx.send(n);
            })),
            ..hello()
        };
        let flag = CancelFlag::new();

        // `next_close` fails the test unless the server sees the connection close.
        let (outcome, _closed_at) = tokio::join!(model.complete(&request, Some(&flag)), async {
            // The stream is open and generating: deltas arrived before the cancel.
            loop {
                let n = tokio::time::timeout(WAIT, deltas.recv())
                    .await
                    .unwrap()
                    .unwrap();
                if n >= 1 {
                    break;
                }
            }
            flag.cancel();
            server.next_close(WAIT).await
        });
        let error = outcome.unwrap_err();
        assert!(
            matches!(error, ModelError::Cancelled { in_flight: true }),
            "{provider}: {error:?}"
        );
        assert_eq!(error.delivery(), Delivery::MaybeDelivered);
        let actions = f.audit_actions().await;
        assert_eq!(
            actions[nth], "http_call_cancelled",
            "{provider}: V6 {actions:?}"
        );
    }
}

#[tokio::test]
async fn a_stream_the_server_ends_before_its_terminal_event_is_maybe_delivered() {
    let f = fixture().await;
    for provider in ["openai", "anthropic"] {
        let head = open_stream(&format!("{provider}_text.sse"), 4);
        let server = TestServer::start(move |_| HttpReply::event_stream(head.clone(), false)).await;
        let model: Box<dyn ModelProvider> = if provider == "openai" {
            Box::new(OpenAiCompatible::new(
                f.egress.clone(),
                server.url("/v1"),
                "m",
            ))
        } else {
            Box::new(Anthropic::new(f.egress.clone(), "m", None).base_url(server.url("/v1")))
        };
        let error = model.complete(&hello(), None).await.unwrap_err();
        assert!(
            matches!(error, ModelError::Incomplete { .. }),
            "{provider}: {error:?}"
        );
        assert_eq!(error.delivery(), Delivery::MaybeDelivered, "{provider}: V8");
        assert!(error.is_retryable(), "{provider}");
    }
}

#[tokio::test]
async fn stream_false_sends_stream_false_and_reads_the_json_answer() {
    let f = fixture().await;
    let mut openai_server = TestServer::start(|_| {
        json_reply(
            200,
            json!({"choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "half"}}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 9}}),
        )
    })
    .await;
    let mut anthropic_server = TestServer::start(|_| {
        json_reply(
            200,
            json!({"content": [{"type": "text", "text": "half"}], "stop_reason": "max_tokens",
                   "usage": {"input_tokens": 3, "output_tokens": 9}}),
        )
    })
    .await;
    let openai =
        OpenAiCompatible::new(f.egress.clone(), openai_server.url("/v1"), "m").stream(false);
    let anthropic = Anthropic::new(f.egress.clone(), "m", None)
        .base_url(anthropic_server.url("/v1"))
        .stream(false);
    for (model, server) in [
        (&openai as &dyn ModelProvider, &mut openai_server),
        (&anthropic as &dyn ModelProvider, &mut anthropic_server),
    ] {
        let turn = model.complete(&hello(), None).await.unwrap();
        assert_eq!(turn.text.as_deref(), Some("half"));
        assert_eq!(turn.finish, Some(FinishReason::Length));
        assert_eq!(turn.usage.map(|u| u.output_tokens), Some(9));
        let seen = server.next_request(WAIT).await;
        assert_eq!(seen.header("accept"), Some("application/json"));
        let body = body_of(&seen);
        assert_eq!(body["stream"], false, "{body}");
        assert!(body.get("stream_options").is_none(), "{body}");
        assert_eq!(body["max_tokens"], 4096, "{body}");
    }
}

#[tokio::test]
async fn a_key_the_server_echoes_into_a_stream_never_reaches_the_turn_or_the_error() {
    let f = fixture().await;
    let key = f.put_key("model-key").await;
    // The server streams back the credential it received, in a text delta, in tool-call
    // arguments, and in an error event.
    let echo = |error: bool| {
        move |request: &runwarden_testkit::HttpRequest| {
            let got = request
                .header("authorization")
                .map(|v| v.trim_start_matches("Bearer ").to_string())
                .or_else(|| request.header("x-api-key").map(str::to_string))
                .unwrap_or_default();
            let anthropic = request.target.ends_with("/messages");
            let events = match (anthropic, error) {
                (false, false) => format!(
                    "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                    json!({"choices": [{"index": 0, "delta": {"content": format!("your key is {got}")}}]}),
                    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "t", "arguments": json!({"k": got}).to_string()}}]}}]}),
                    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                ),
                (false, true) => format!(
                    "data: {}\n\n",
                    json!({"error": {"message": format!("bad key {got}"), "type": "invalid_request_error"}})
                ),
                (true, false) => format!(
                    "event: content_block_start\ndata: {}\n\nevent: content_block_delta\ndata: {}\n\nevent: message_stop\ndata: {}\n\n",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("your key is {got}")}}),
                    json!({"type": "message_stop"}),
                ),
                (true, true) => format!(
                    "event: error\ndata: {}\n\n",
                    json!({"type": "error", "error": {"type": "authentication_error", "message": format!("bad key {got}")}})
                ),
            };
            HttpReply::event_stream(vec![events.into_bytes()], false)
        }
    };
    for error in [false, true] {
        let server = TestServer::start(echo(error)).await;
        let openai = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "m")
            .api_key(Some(key.clone()));
        let anthropic =
            Anthropic::new(f.egress.clone(), "m", key.clone()).base_url(server.url("/v1"));
        for model in [&openai as &dyn ModelProvider, &anthropic] {
            let shown = match model.complete(&hello(), None).await {
                Ok(turn) => format!("{turn:?}"),
                Err(e) => format!("{e} {e:?}"),
            };
            assert!(!shown.contains(KEY_SIGIL), "V9: {shown}");
            assert!(
                shown.contains("[redacted]"),
                "the echo was read, redacted: {shown}"
            );
        }
    }
    let rows = format!("{:?}", f.audit().await);
    assert!(!rows.contains(KEY_SIGIL));
}

#[tokio::test]
async fn a_request_that_streams_reports_progress_and_one_that_does_not_stays_quiet() {
    let f = fixture().await;
    let stream = by_event(&recorded("openai_text.sse"));
    let server = TestServer::start(move |request| {
        if body_of(request)["stream"] == true {
            HttpReply::event_stream(stream.clone(), false)
        } else {
            json_reply(200, json!({"choices": [{"message": {"content": "whole"}}]}))
        }
    })
    .await;
    let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sink = counted.clone();
    let request = ModelRequest {
        progress: Some(Progress::new(move |n| {
            sink.store(n, std::sync::atomic::Ordering::SeqCst);
        })),
        ..hello()
    };
    let model = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "m");
    model.complete(&request, None).await.unwrap();
    assert_eq!(counted.load(std::sync::atomic::Ordering::SeqCst), 6);
    counted.store(0, std::sync::atomic::Ordering::SeqCst);
    let turn = model.stream(false).complete(&request, None).await.unwrap();
    assert_eq!(turn.text.as_deref(), Some("whole"));
    assert_eq!(counted.load(std::sync::atomic::Ordering::SeqCst), 0);
}
