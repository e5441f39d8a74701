//! M19 against a real 2026-07-28 server: the official Python SDK (`tests/peer/server.py`
//! with `modern_tools.py`), which serves the stateless revision to a client that probes
//! `server/discover` and checks what it gets (the `_meta` keys, `Mcp-Param-*` headers
//! against the arguments, and its own sealed `requestState`). Old servers get the
//! 2025-11-25 handshake after the probe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_mcp::{
    ElicitationAnswer, ElicitationFuture, ElicitationPolicy, ElicitationRequest, Elicitor,
    ElicitorHandle, InputResume, McpClient, Reply, Request, STATELESS_VERSION, ServerConfig,
    ToolOutcome,
};
use runwarden_testkit::{HttpReply, HttpRequest, Peer, TestServer, mcp_handler};
use runwarden_vault::{CancelFlag, Delivery};
use serde_json::{Map, Value, json};

use crate::peer::{call, wait_for_stats};
use crate::support::{WAIT, fixture};

async fn start() -> Peer {
    tokio::task::spawn_blocking(|| Peer::start(&[]))
        .await
        .unwrap()
}

/// The peer's record of the `mcp-*` headers of the last POST of each method.
fn modern(peer: &Peer) -> Value {
    serde_json::from_str(&peer.get("/modern-stats")).expect("modern stats are JSON")
}

fn methods(legs: &[runwarden_mcp::LegReport]) -> Vec<&str> {
    legs.iter().map(|l| l.method.as_str()).collect()
}

/// An operator who confirms whatever is asked.
struct Confirms;

impl Elicitor for Confirms {
    fn elicit(&self, _request: ElicitationRequest) -> ElicitationFuture {
        let content = Map::from_iter([("confirmed".to_string(), json!(true))]);
        Box::pin(async move { ElicitationAnswer::Accept(content) })
    }
}

#[tokio::test]
async fn a_2026_server_is_spoken_to_without_initialize_with_meta_and_the_standard_headers() {
    let peer = start().await;
    let f = fixture().await;
    let client = McpClient::new(ServerConfig::new("peer", peer.url()), f.egress.clone());
    let listed = client.send_request(Request::ListTools, None).await;
    assert!(
        matches!(&listed, Ok(Reply::Tools(t)) if t.iter().any(|t| t.name == "route")),
        "{listed:?}"
    );
    let echoed = client
        .call_tool(call("echo", json!({"text": "hi"})), None)
        .await;
    assert_eq!(echoed.result.text, "hi", "{:?}", echoed.result);
    // No handshake, no session: the call is one leg (the SDK refuses a request whose
    // _meta lacks the version or the capabilities, so the answer proves them too).
    assert_eq!(methods(&echoed.legs), ["tools/call"]);
    let seen = modern(&peer);
    let headers = &seen["headers"]["tools/call"];
    assert_eq!(headers["mcp-method"], "tools/call", "{seen:#}");
    assert_eq!(headers["mcp-name"], "echo", "{seen:#}");
    assert_eq!(headers["mcp-protocol-version"], STATELESS_VERSION);
    assert_eq!(headers.get("mcp-session-id"), None, "no session: {seen:#}");
    assert_eq!(
        seen["headers"]["server/discover"]["mcp-method"],
        "server/discover"
    );
    assert_eq!(seen["headers"].get("initialize"), None, "{seen:#}");
}

#[tokio::test]
async fn parameters_marked_x_mcp_header_are_mirrored_into_mcp_param_headers() {
    let peer = start().await;
    let f = fixture().await;
    let client = McpClient::new(ServerConfig::new("peer", peer.url()), f.egress.clone());
    // The client has not listed the tool yet: it learns its headers in the same operation.
    let routed = client
        .call_tool(
            call(
                "route",
                json!({"region": " eu west\r\n", "priority": 7, "query": "q"}),
            ),
            None,
        )
        .await;
    assert_eq!(
        routed.result.outcome,
        ToolOutcome::Succeeded,
        "the SDK checks the headers against the arguments: {:?}",
        routed.result
    );
    assert_eq!(
        methods(&routed.legs),
        ["server/discover", "tools/list", "tools/call"]
    );
    let headers = &modern(&peer)["headers"]["tools/call"];
    // Edge spaces and CR/LF travel as Base64, never raw.
    assert_eq!(
        headers["mcp-param-region"], "=?base64?IGV1IHdlc3QNCg==?=",
        "{headers:#}"
    );
    assert_eq!(headers["mcp-param-priority"], "7", "{headers:#}");
    assert_eq!(
        headers.get("mcp-param-query"),
        None,
        "not marked, not mirrored"
    );
}

#[tokio::test]
async fn an_argument_that_cannot_be_its_header_refuses_the_call_before_anything_is_sent() {
    let peer = start().await;
    let f = fixture().await;
    let client = McpClient::new(ServerConfig::new("peer", peer.url()), f.egress.clone());
    client.send_request(Request::ListTools, None).await.unwrap();
    for arguments in [
        json!({"region": "eu", "priority": 1.5, "query": "q"}),
        json!({"region": {"name": "eu"}, "priority": 1, "query": "q"}),
        json!({"region": "eu", "priority": 9_007_199_254_740_993_i64, "query": "q"}),
    ] {
        let refused = client
            .call_tool(call("route", arguments.clone()), None)
            .await;
        assert_eq!(refused.result.outcome, ToolOutcome::Failed, "{arguments}");
        assert_eq!(refused.result.delivery, Delivery::NotSent, "{arguments}");
        assert!(
            refused.result.text.contains("Mcp-Param-"),
            "the refusal names the header: {}",
            refused.result.text
        );
        assert_eq!(refused.request_id, None, "no tools/call was sent");
    }
    assert_eq!(
        modern(&peer)["headers"].get("tools/call"),
        None,
        "the server saw no call"
    );
}

#[tokio::test]
async fn a_cancel_closes_the_stream_and_sends_no_cancelled_notification() {
    let peer = start().await;
    let f = fixture().await;
    let client = Arc::new(McpClient::new(
        ServerConfig::new("peer", peer.url()),
        f.egress.clone(),
    ));
    let flag = CancelFlag::new();
    let (task_client, task_flag) = (client.clone(), flag.clone());
    let task = tokio::spawn(async move {
        task_client
            .call_tool(call("slow", json!({"seconds": 30.0})), Some(&task_flag))
            .await
    });
    wait_for_stats(&peer, |s| s["slow_started"] == 1).await;
    let cancelled_at = Instant::now();
    flag.cancel();
    let outcome = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(2));
    assert_eq!(outcome.result.outcome, ToolOutcome::Cancelled);
    // M4 (amended), M19: the closed stream is the cancel; no notice follows.
    assert!(
        !methods(&outcome.legs).contains(&"notifications/cancelled"),
        "{:?}",
        methods(&outcome.legs)
    );
    let after = wait_for_stats(&peer, |s| s["slow_cancelled"] == 1).await;
    assert_eq!(after["slow_completed"], 0, "the server stopped the work");
    assert_eq!(after["cancel_notifications"], 0);
    assert_eq!(modern(&peer)["cancel_notifications"], 0);
}

#[tokio::test]
async fn an_input_required_result_is_answered_and_the_call_re_issued_with_the_request_state() {
    let peer = start().await;
    let f = fixture().await;
    let mut server = ServerConfig::new("peer", peer.url());
    server.elicitation = ElicitationPolicy::Operator;
    let client = McpClient::new(server, f.egress.clone());
    let mut request = call("confirm_ship", json!({"item": "box"}));
    request.elicitor = Some(ElicitorHandle(Arc::new(Confirms)));
    let shipped = client.call_tool(request, None).await;
    assert_eq!(
        shipped.result.text, "shipped box: confirmed=True",
        "{:?}",
        shipped.result
    );
    // The probe, the listing that learns the tool's headers, the call and its re-issue.
    assert_eq!(
        methods(&shipped.legs),
        ["server/discover", "tools/list", "tools/call", "tools/call"]
    );
    assert_eq!(modern(&peer)["confirm_ship_runs"], 1);
}

#[tokio::test]
async fn a_parked_question_is_resumed_by_another_client_with_the_exact_request_state() {
    let peer = start().await;
    let f = fixture().await;
    let mut server = ServerConfig::new("peer", peer.url());
    server.elicitation = ElicitationPolicy::Operator;
    let first = McpClient::new(server.clone(), f.egress.clone());
    let mut request = call("confirm_ship", json!({"item": "box"}));
    request.park_on_input = true;
    let asked = first.call_tool(request.clone(), None).await;
    let question = asked.input_required.expect("the server asked");
    assert_eq!(asked.result.delivery, Delivery::Answered);
    assert_eq!(question.requests.len(), 1);
    assert_eq!(question.requests[0].method, "elicitation/create");
    let state = question
        .request_state
        .clone()
        .expect("the SDK sends a state");
    assert_eq!(modern(&peer)["confirm_ship_runs"], 0, "nothing ran yet");

    let answer = |state: String| InputResume {
        responses: Map::from_iter([(
            question.requests[0].key.clone(),
            json!({"action": "accept", "content": {"confirmed": true}}),
        )]),
        request_state: Some(state),
    };
    // Another client (as another worker process would be) re-issues the call.
    let second = McpClient::new(server, f.egress.clone());
    let mut tampered = state.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let mut forged = request.clone();
    forged.resume = Some(answer(tampered));
    let refused = second.call_tool(forged, None).await;
    assert!(!refused.result.is_success(), "a changed state is refused");
    assert_eq!(modern(&peer)["confirm_ship_runs"], 0);

    request.resume = Some(answer(state));
    let shipped = second.call_tool(request, None).await;
    assert_eq!(
        shipped.result.text, "shipped box: confirmed=True",
        "{:?}",
        shipped.result
    );
    assert!(shipped.input_required.is_none());
    assert_eq!(modern(&peer)["confirm_ship_runs"], 1);
}

/// An old server: a 2025-11-25 MCP server that answers `server/discover` with HTTP 400.
fn old_server(request: &HttpRequest) -> HttpReply {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    if body["method"] == "server/discover" {
        return HttpReply::typed(
            400,
            "text/plain",
            "Bad Request: No valid session ID provided",
        );
    }
    let handler = mcp_handler(vec![runwarden_testkit::tool("search")], &[]);
    handler(request)
}

#[tokio::test]
async fn an_old_server_gets_the_2025_handshake_after_the_probe() {
    let f = fixture().await;
    for (label, server) in [
        ("HTTP 400", TestServer::start(old_server).await),
        (
            "a result without 2026-07-28",
            TestServer::start(mcp_handler(vec![runwarden_testkit::tool("search")], &[])).await,
        ),
    ] {
        let mut server = server;
        let client = McpClient::new(
            ServerConfig::new("old", server.url("/mcp")),
            f.egress.clone(),
        );
        let called = client
            .call_tool(call("search", json!({"q": "x"})), None)
            .await;
        assert!(called.result.is_success(), "{label}: {:?}", called.result);
        assert_eq!(
            methods(&called.legs),
            [
                "server/discover",
                "initialize",
                "notifications/initialized",
                "tools/call"
            ],
            "{label}"
        );
        let requests = server.drain_requests();
        let last = requests.last().unwrap();
        assert_eq!(
            last.header("mcp-protocol-version"),
            Some("2025-11-25"),
            "{label}"
        );
        let body: Value = serde_json::from_slice(&last.body).unwrap();
        assert_eq!(
            body["params"]["_meta"].get("io.modelcontextprotocol/protocolVersion"),
            None,
            "{label}: no 2026 _meta on a session"
        );
    }
}
