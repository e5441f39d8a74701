//! V9 through both model providers: an endpoint that echoes the API key it received (in
//! its answer, a tool call's arguments, an error body, a header, the content type or a
//! redirect) never gets it into a turn, an error or an audit row.

use std::sync::{Arc, Mutex};

use runwarden_models::{Anthropic, ModelProvider, ModelRequest, OpenAiCompatible};
use runwarden_testkit::{
    Channel, TestServer, echo_handler, find_form, forms_of, json_decoded, received_credential,
};
use serde_json::{Value, json};

use crate::support::{KEY_SIGIL, fixture, hello, tickets_create};

/// A first round with a tool on offer: the echoing model calls it with the key as argument.
fn with_a_tool() -> ModelRequest {
    ModelRequest {
        tools: vec![tickets_create()],
        ..hello()
    }
}

#[tokio::test]
async fn an_echoed_api_key_never_reaches_a_turn_an_error_or_an_audit_row() {
    let f = fixture().await;
    let key = f.put_key("model-key").await;
    let channel = Arc::new(Mutex::new(Channel::Body));
    let mut server = TestServer::start(echo_handler(channel.clone(), vec![])).await;
    let mut openai = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "m");
    openai.api_key = Some(key.clone());
    let mut anthropic = Anthropic::new(f.egress.clone(), "m", key);
    anthropic.base_url = server.url("/v1");
    let providers: [(&str, &dyn ModelProvider); 2] =
        [("openai", &openai), ("anthropic", &anthropic)];
    let forms = forms_of(KEY_SIGIL);
    for (provider, model) in providers {
        for echo in Channel::ALL {
            *channel.lock().unwrap() = echo;
            let mut returned = String::new();
            for request in [hello(), with_a_tool()] {
                match model.complete(&request, None).await {
                    Ok(turn) => returned.push_str(&format!("{turn:?}\n")),
                    Err(error) => returned.push_str(&format!("{error}\n{error:?}\n")),
                }
            }
            let seen = server.drain_requests();
            assert!(
                seen.iter()
                    .all(|r| received_credential(r).iter().any(|f| f.contains(KEY_SIGIL))),
                "{provider} {echo:?}: the key did not reach the server: {seen:?}"
            );
            assert_eq!(
                find_form(&returned, &forms),
                None,
                "{provider} {echo:?}: a form of the key came back:\n{returned}"
            );
            if echo != Channel::Header {
                assert!(
                    returned.contains("[redacted]"),
                    "{provider} {echo:?}: the echo was not shown redacted:\n{returned}"
                );
            }
        }
    }
    let rows = format!("{:?}", f.audit().await);
    assert_eq!(find_form(&rows, &forms), None, "{rows}");
}

/// Another server's credential, stored beside the model's key.
const OTHER_SIGIL: &str = "tickets-sigil-4f2a9b";

/// `text` cut in two, the second half with every character a `\u` escape: what the
/// server writes into two consecutive deltas (the JSON text of the second one spells it).
fn halves(text: &str) -> (String, String) {
    let (a, b) = text.split_at(text.len() / 2);
    (a.to_string(), b.to_string())
}

/// A stream that sends the key it received back split across two text deltas, and the key
/// and [`OTHER_SIGIL`] each split across tool-call argument deltas, every delta after the
/// first spelt with escapes.
fn split_echo(request: &runwarden_testkit::HttpRequest) -> runwarden_testkit::HttpReply {
    use runwarden_testkit::Spelling;
    let got = received_credential(request)
        .into_iter()
        .find(|f| f.contains(KEY_SIGIL))
        .map(|f| f.trim_start_matches("Bearer ").to_string())
        .unwrap_or_default();
    let (t1, t2) = halves(&format!("your key is {got}"));
    // Cut inside each secret: no one delta holds either whole.
    let arguments = json!({"q": got, "token": OTHER_SIGIL}).to_string();
    let (first, rest) = arguments.split_at(arguments.find(KEY_SIGIL).unwrap_or(0) + 5);
    let (second, third) = rest.split_at(rest.find(OTHER_SIGIL).unwrap_or(0) + 5);
    let (a1, a2, a3) = (first.to_string(), second.to_string(), third.to_string());
    // A delta's JSON with its string value spelt: every character of the second half
    // escaped, so no raw byte run of the stream holds the secret either.
    let spelt = |template: Value, value: &str| {
        let plain = Spelling::Raw.spell(value);
        template
            .to_string()
            .replace(&plain, &Spelling::AllEscape.spell(value))
    };
    let anthropic = request.target.ends_with("/messages");
    let events: Vec<String> = if anthropic {
        let block = |index: u64, delta: Value| json!({"type": "content_block_delta", "index": index, "delta": delta});
        vec![
            format!(
                "event: message_start\ndata: {}\n\n",
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 3}}})
            ),
            format!(
                "event: content_block_start\ndata: {}\n\n",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                block(0, json!({"type": "text_delta", "text": t1}))
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                spelt(block(0, json!({"type": "text_delta", "text": t2})), &t2)
            ),
            format!(
                "event: content_block_start\ndata: {}\n\n",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "tickets__create", "input": {}}})
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                block(1, json!({"type": "input_json_delta", "partial_json": a1}))
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                spelt(
                    block(1, json!({"type": "input_json_delta", "partial_json": a2})),
                    &a2
                )
            ),
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                spelt(
                    block(1, json!({"type": "input_json_delta", "partial_json": a3})),
                    &a3
                )
            ),
            format!(
                "event: message_delta\ndata: {}\n\n",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}})
            ),
            format!(
                "event: message_stop\ndata: {}\n\n",
                json!({"type": "message_stop"})
            ),
        ]
    } else {
        let delta = |delta: Value| json!({"choices": [{"index": 0, "delta": delta}]});
        let call = |arguments: &str, first: bool| {
            let mut function = json!({"arguments": arguments});
            if first {
                function["name"] = json!("tickets__create");
            }
            let mut call = json!({"index": 0, "function": function});
            if first {
                call["id"] = json!("call_1");
            }
            delta(json!({"tool_calls": [call]}))
        };
        vec![
            format!("data: {}\n\n", delta(json!({"content": t1}))),
            format!("data: {}\n\n", spelt(delta(json!({"content": t2})), &t2)),
            format!("data: {}\n\n", call(&a1, true)),
            format!("data: {}\n\n", spelt(call(&a2, false), &a2)),
            format!("data: {}\n\n", spelt(call(&a3, false), &a3)),
            format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
            ),
            "data: [DONE]\n\n".to_string(),
        ]
    };
    runwarden_testkit::HttpReply::event_stream(
        events.into_iter().map(String::into_bytes).collect(),
        false,
    )
}

#[tokio::test]
async fn a_secret_split_across_streamed_deltas_is_caught_once_the_turn_is_whole() {
    let f = fixture().await;
    let key = f.put_key("model-key").await;
    f.vault
        .secret_put(
            &runwarden_vault::SecretName::new("tickets-token").unwrap(),
            runwarden_vault::SecretValue::new(OTHER_SIGIL.as_bytes().to_vec()),
        )
        .await
        .unwrap();
    let server = TestServer::start(split_echo).await;
    let openai = OpenAiCompatible::new(f.egress.clone(), server.url("/v1"), "m")
        .api_key(Some(key.clone()))
        .stream(true);
    let anthropic = Anthropic::new(f.egress.clone(), "m", key)
        .base_url(server.url("/v1"))
        .stream(true);
    let forms: Vec<String> = forms_of(KEY_SIGIL)
        .into_iter()
        .chain(forms_of(OTHER_SIGIL))
        .collect();
    for (provider, model) in [
        ("openai", &openai as &dyn ModelProvider),
        ("anthropic", &anthropic),
    ] {
        let mut request = with_a_tool();
        request.correlation = Some(format!("run-{provider}"));
        let turn = model.complete(&request, None).await.unwrap();
        let shown = format!("{turn:?}");
        assert_eq!(
            find_form(&json_decoded(&shown), &forms),
            None,
            "{provider}: {shown}"
        );
        let text = turn.text.clone().unwrap_or_default();
        assert!(
            text.starts_with("your key is [redacted]"),
            "{provider}: {text}"
        );
        // The arguments carried both secrets: the call is refused, never made.
        let call = &turn.tool_calls[0];
        assert_eq!(call.arguments, Value::Null, "{provider}");
        let why = call.invalid_arguments.clone().unwrap_or_default();
        assert!(why.contains("(secret_exfiltration)"), "{provider}: {why}");
        assert!(
            why.contains("\"model-key\"") && why.contains("\"tickets-token\""),
            "{provider}: {why}"
        );
    }
    let rows = f.audit().await;
    let refused: Vec<_> = rows
        .iter()
        .filter(|r| r.event.reason.as_deref() == Some("secret_exfiltration"))
        .collect();
    assert_eq!(refused.len(), 2, "one row a provider: {rows:?}");
    for row in refused {
        assert_eq!(row.event.host, "tool tickets__create");
        assert_eq!(row.event.secret.as_deref(), Some("model-key,tickets-token"));
        assert!(
            row.event
                .correlation
                .as_deref()
                .is_some_and(|c| c.starts_with("run-"))
        );
    }
    let rows = format!("{rows:?}");
    assert_eq!(find_form(&json_decoded(&rows), &forms), None, "{rows}");
}
