//! V9 through both model providers: an endpoint that echoes the API key it received (in
//! its answer, a tool call's arguments, an error body, a header, the content type or a
//! redirect) never gets it into a turn, an error or an audit row.

use std::sync::{Arc, Mutex};

use runwarden_models::{Anthropic, ModelProvider, ModelRequest, OpenAiCompatible};
use runwarden_testkit::{
    Channel, TestServer, echo_handler, find_form, forms_of, received_credential,
};

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
