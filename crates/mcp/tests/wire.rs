//! The wire against scripted servers: the version table, the capabilities declared, a
//! stream that ends early with or without a way to resume it, a session's end bounded in
//! time, and a standalone stream not asked for again. The same against the official Python
//! SDK is in the `peer` target.

use std::time::Duration;

use runwarden_mcp::{
    ElicitationPolicy, MAX_RESUMES, McpClient, McpError, ProtocolPolicy, Reply, Request,
    ServerConfig, ToolOutcome, USER_AGENT,
};
use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler};
use runwarden_vault::Delivery;
use serde_json::{Value, json};

use crate::support::scripted::{self, Script};
use crate::support::{call, fixture};

#[tokio::test]
async fn a_stream_that_ends_early_without_event_ids_is_maybe_delivered() {
    // The scripted server's stream carries no event ids: nothing to resume from.
    let f = fixture().await;
    let server = scripted::start(Script {
        fail: Some(("tools/call", scripted::Shape::StreamWithoutOurResponse)),
        ..Script::new(scripted::SESSION_SSE)
    })
    .await;
    let client = f.client(server.url("/mcp"), None);
    let outcome = client
        .call_tool(call("search", json!({"q": "x"})), None)
        .await;
    assert_eq!(outcome.result.delivery, Delivery::MaybeDelivered);
}

#[tokio::test]
async fn versions_are_negotiated_by_the_table() {
    let table = [
        ("2025-11-25", None),
        ("2025-06-18", None),
        ("2025-03-26", None),
        // It answered a Streamable HTTP initialize: the transport is right, the version
        // is too old (the old text blamed the transport).
        (
            "2024-11-05",
            Some(
                "answered initialize with protocol version 2024-11-05, older than any runwarden speaks",
            ),
        ),
        (
            "2099-01-01",
            Some("runwarden speaks 2025-11-25, 2025-06-18, 2025-03-26"),
        ),
    ];
    for (version, refusal) in table {
        let f = fixture().await;
        let mut server = scripted::start(Script {
            version: version.into(),
            ..Script::new(scripted::SESSION_SSE)
        })
        .await;
        let client = f.client(server.url("/mcp"), None);
        let answer = client.send_request(Request::Ping, None).await;
        let requests = server.drain_requests();
        // M17: we always offer the newest.
        assert_eq!(
            scripted::body_of(&requests[0])["params"]["protocolVersion"],
            "2025-11-25"
        );
        match refusal {
            None => {
                assert!(matches!(answer, Ok(Reply::Pong)), "{version}: {answer:?}");
                assert_eq!(
                    requests.last().unwrap().header("mcp-protocol-version"),
                    Some(version)
                );
            }
            Some(says) => {
                let error = answer.unwrap_err();
                assert!(matches!(error, McpError::Protocol { .. }), "{error}");
                assert!(error.to_string().contains(says), "{version}: {error}");
            }
        }
    }
}

#[tokio::test]
async fn no_sampling_or_roots_capability_is_declared_and_elicitation_only_for_the_operator() {
    for (policy, expected) in [
        (ElicitationPolicy::Decline, json!({})),
        (
            ElicitationPolicy::Operator,
            json!({"elicitation": {"form": {}}}),
        ),
    ] {
        let f = fixture().await;
        let mut server = scripted::start(Script::new(scripted::SESSION_SSE)).await;
        let mut config = ServerConfig::new("tickets", server.url("/mcp"))
            .with_protocol(ProtocolPolicy::Handshake);
        config.elicitation = policy;
        let client = McpClient::new(config, f.egress.clone());
        assert!(client.send_request(Request::Ping, None).await.is_ok());
        let requests = server.drain_requests();
        assert_eq!(
            scripted::body_of(&requests[0])["params"]["capabilities"],
            expected
        );
        assert_eq!(requests[0].header("user-agent"), Some(USER_AGENT));
    }
}

/// A server whose `tools/call` stream gives an event id and `retry: 10`, then ends before
/// the answer; every resumption GET gets `get_status` (and a stream that ends again when
/// it is 200). Initialize and notifications are answered as usual.
fn closing_server(get_status: u16) -> impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static {
    let inner = mcp_handler(vec![runwarden_testkit::tool("search")], &[]);
    move |request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if request.method == "GET" {
            return if get_status == 200 {
                HttpReply::event_stream(vec![b"id: 2\ndata: \n\n".to_vec()], false)
            } else {
                HttpReply::text(get_status, "")
            };
        }
        if body["method"] == "tools/call" {
            return HttpReply::event_stream(vec![b"id: 1\nretry: 10\ndata: \n\n".to_vec()], false);
        }
        inner(request)
    }
}

#[tokio::test]
async fn a_resumption_the_server_refuses_is_maybe_delivered_and_never_re_posts_the_call() {
    for get_status in [405, 200] {
        let f = fixture().await;
        let mut server = TestServer::start(closing_server(get_status)).await;
        let client = f.client(server.url("/mcp"), None);
        let outcome = client
            .call_tool(call("search", json!({"q": "x"})), None)
            .await;
        assert_eq!(outcome.result.outcome, ToolOutcome::Failed, "{get_status}");
        assert_eq!(
            outcome.result.delivery,
            Delivery::MaybeDelivered,
            "{get_status}"
        );
        assert!(
            outcome.result.text.contains("could not be resumed"),
            "{get_status}: {}",
            outcome.result.text
        );
        let requests = server.drain_requests();
        let posts = requests
            .iter()
            .filter(|r| scripted::method_of(r) == "tools/call")
            .count();
        let gets: Vec<&HttpRequest> = requests.iter().filter(|r| r.method == "GET").collect();
        assert_eq!(posts, 1, "{get_status}: the call is never re-sent");
        // 405 ends it at once; a stream that keeps ending early is retried a bounded number of times.
        let expected = if get_status == 405 { 1 } else { MAX_RESUMES };
        assert_eq!(gets.len(), expected, "{get_status}");
        assert_eq!(gets[0].header("last-event-id"), Some("1"));
        assert_eq!(gets[0].header("accept"), Some("text/event-stream"));
        if get_status == 200 {
            assert_eq!(gets[1].header("last-event-id"), Some("2"), "the latest id");
        }
    }
}

#[tokio::test]
async fn ending_a_session_is_bounded_at_two_seconds_when_the_server_never_answers() {
    let f = fixture().await;
    let inner = mcp_handler(vec![runwarden_testkit::tool("search")], &[]);
    let mut server = TestServer::start(move |request: &HttpRequest| {
        if request.method == "DELETE" {
            return HttpReply::Stall;
        }
        let initialize = scripted::method_of(request) == "initialize";
        let reply = inner(request);
        if initialize {
            reply.with_header("mcp-session-id", "s-1")
        } else {
            reply
        }
    })
    .await;
    let client = f.client(server.url("/mcp"), None);
    assert!(client.send_request(Request::Ping, None).await.is_ok());
    let started = std::time::Instant::now();
    let closed = client.close().await;
    let took = started.elapsed();
    assert!(closed.is_err(), "a DELETE that never came back is reported");
    assert!(
        took >= Duration::from_millis(1_500) && took < Duration::from_secs(3),
        "bounded at {:?}: {took:?}",
        runwarden_mcp::CLOSE_BUDGET
    );
    let delete = server
        .drain_requests()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .expect("the DELETE was sent");
    assert_eq!(delete.header("mcp-session-id"), Some("s-1"));
    // The next operation starts a new session rather than reusing the ended one.
    assert!(client.send_request(Request::Ping, None).await.is_ok());
    assert_eq!(
        server
            .drain_requests()
            .iter()
            .map(scripted::method_of)
            .collect::<Vec<_>>(),
        ["initialize", "notifications/initialized", "ping"]
    );
}

#[tokio::test]
async fn a_standalone_get_answered_without_an_event_stream_is_not_asked_for_again() {
    let f = fixture().await;
    // The testkit's server issues a session and answers every GET with a JSON body, not
    // an event stream: it offers no standalone stream.
    let inner = mcp_handler(vec![runwarden_testkit::tool("search")], &[]);
    let mut server = TestServer::start(move |request: &HttpRequest| {
        let initialize = scripted::method_of(request) == "initialize";
        let reply = inner(request);
        if initialize {
            reply.with_header("mcp-session-id", "s-1")
        } else {
            reply
        }
    })
    .await;
    let client = f.client(server.url("/mcp"), None);
    for _ in 0..10 {
        let outcome = client
            .call_tool(call("search", json!({"q": "x"})), None)
            .await;
        assert_eq!(outcome.result.outcome, ToolOutcome::Succeeded);
    }
    let requests = server.drain_requests();
    let gets = requests.iter().filter(|r| r.method == "GET").count();
    let calls = requests
        .iter()
        .filter(|r| scripted::method_of(r) == "tools/call")
        .count();
    assert_eq!(
        (gets, calls),
        (1, 10),
        "one GET for the session, not one per call"
    );
}

/// A tool call in flight holds its future's state for as long as it waits. The rare paths
/// (the handshake, a tool list for a stateless call's headers, the OAuth client, a
/// server's questions and their answers, a session's standalone stream, the cancel
/// notification) are boxed, so their states do not set its size: it was 11,224 bytes
/// in a debug build with them inline, 9,232 since (in release 10,624 and 8,472).
#[tokio::test]
async fn a_tool_call_in_flight_holds_under_ten_kib_of_state() {
    let f = fixture().await;
    let client = f.client("http://127.0.0.1:9/mcp".into(), None);
    let pending = client.call_tool(call("search", json!({"q": "x"})), None);
    let size = std::mem::size_of_val(&pending);
    assert!(size < 10 * 1024, "a tool call's state is {size} bytes");
}
