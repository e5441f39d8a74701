//! Fixtures for the model tests: the shared loopback vault of `runwarden-testkit`, keys,
//! requests.

#![allow(dead_code, unreachable_pub)]

use std::ops::Deref;
use std::time::Duration;

use runwarden_models::{Message, ModelRequest, ToolCallRequest, ToolSpec};
use runwarden_testkit::{HttpReply, HttpRequest, LoopbackVault};
use runwarden_vault::SecretName;
use serde_json::{Value, json};

/// How long a test waits for an event before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A key value no provider could make up, so finding it proves where it went.
pub const KEY_SIGIL: &str = "sk-sigil-5c9e1b";

/// A vault over a fresh SQLite file and an egress client that admits loopback: the
/// testkit's, with its audit helpers.
pub struct Fixture(LoopbackVault);

impl Deref for Fixture {
    type Target = LoopbackVault;

    fn deref(&self) -> &LoopbackVault {
        &self.0
    }
}

pub async fn fixture() -> Fixture {
    Fixture(runwarden_testkit::loopback_vault().await)
}

impl Fixture {
    /// Stores [`KEY_SIGIL`] under `name` and names it.
    pub async fn put_key(&self, name: &str) -> SecretName {
        self.put_secret(name, KEY_SIGIL).await
    }
}

/// A JSON answer.
pub fn json_reply(status: u16, body: Value) -> HttpReply {
    HttpReply::json(status, &body)
}

/// The body of a request the server saw, as JSON.
pub fn body_of(request: &HttpRequest) -> Value {
    serde_json::from_slice(&request.body).expect("the request body is JSON")
}

/// A tool on offer.
pub fn tickets_create() -> ToolSpec {
    ToolSpec {
        name: "tickets__create".into(),
        description: Some("Opens a ticket".into()),
        input_schema: json!({"type": "object", "properties": {"title": {"type": "string"}}}),
    }
}

/// A conversation in its second round: prompt, one assistant turn with two tool calls,
/// both results.
pub fn second_round() -> ModelRequest {
    ModelRequest {
        system: Some("You file tickets.".into()),
        messages: vec![
            Message::User {
                text: "File two tickets.".into(),
            },
            Message::Assistant {
                text: Some("Filing them.".into()),
                tool_calls: vec![
                    ToolCallRequest {
                        id: "c1".into(),
                        name: "tickets__create".into(),
                        arguments: json!({"title": "one"}),
                        invalid_arguments: None,
                    },
                    ToolCallRequest {
                        id: "c2".into(),
                        name: "tickets__create".into(),
                        arguments: json!({"title": "two"}),
                        invalid_arguments: None,
                    },
                ],
            },
            Message::Tool {
                call_id: "c1".into(),
                name: "tickets__create".into(),
                content: "created T-1".into(),
                is_error: false,
            },
            Message::Tool {
                call_id: "c2".into(),
                name: "tickets__create".into(),
                content: "quota exceeded".into(),
                is_error: true,
            },
        ],
        tools: vec![tickets_create()],
        correlation: Some("run-42".into()),
        progress: None,
        max_tokens: None,
    }
}

/// A first-round request with no tools.
pub fn hello() -> ModelRequest {
    ModelRequest {
        system: None,
        messages: vec![Message::User {
            text: "Hello".into(),
        }],
        tools: Vec::new(),
        correlation: None,
        progress: None,
        max_tokens: None,
    }
}
