//! The client against the servers people run: the official Python SDK in each of its
//! modes (2026-07-28 with event streams, and stateless with plain JSON, and 1.x with
//! sessions): health that fits each version, answers over the size limit, budgets that are
//! the whole operation's, and the run tag on a session's `DELETE`. The same against
//! scripted servers is in the fast target's `servers`.

use std::sync::Arc;
use std::time::Duration;

use runwarden_mcp::{
    McpClient, McpError, ProtocolPolicy, Reply, Request, STATELESS_VERSION, ServerConfig,
    ToolOutcome,
};
use runwarden_testkit::{HttpReply, HttpRequest, Peer, TestServer, mcp_handler, tool};
use runwarden_vault::Delivery;
use serde_json::{Value, json};

use crate::peer::{call, stats};
use crate::support::{fixture, methods};

/// The Python SDK's two stateless modes: event streams (its default) and plain JSON.
const MODES: [&[&str]; 2] = [&[], &["--stateless", "--json-response"]];

async fn start(flags: &'static [&'static str]) -> Peer {
    tokio::task::spawn_blocking(move || Peer::start(flags))
        .await
        .unwrap()
}

#[tokio::test]
async fn health_probes_a_2026_server_with_server_discover_never_with_ping() {
    for flags in MODES {
        let peer = start(flags).await;
        let f = fixture().await;
        let client = McpClient::new(ServerConfig::new("peer", peer.url()), f.egress.clone());
        let reply = client.send_request(Request::Health, None).await;
        assert!(
            matches!(&reply, Ok(Reply::Alive { protocol, probe })
                if protocol == STATELESS_VERSION && probe == "server/discover"),
            "{flags:?}: {reply:?}"
        );
        // A second probe on the same connection sends server/discover again, not ping.
        let again = client.send_request(Request::Health, None).await;
        assert!(matches!(again, Ok(Reply::Alive { .. })), "{again:?}");
        let trail = client.last_request().unwrap();
        assert_eq!(methods(&trail.legs), ["server/discover"], "{flags:?}");
        assert_eq!(trail.protocol.as_deref(), Some(STATELESS_VERSION));
    }
}

#[tokio::test]
async fn health_pings_an_older_server_and_lists_tools_when_it_has_no_ping() {
    let peer = start(&[]).await;
    let f = fixture().await;
    let old = McpClient::new(
        ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    );
    let reply = old.send_request(Request::Health, None).await;
    assert!(
        matches!(&reply, Ok(Reply::Alive { protocol, probe }) if protocol == "2025-11-25" && probe == "ping"),
        "{reply:?}"
    );
    old.close().await.unwrap();

    // A 2025 server that does not implement ping.
    let handler = mcp_handler(vec![tool("search")], &[]);
    let server = TestServer::start(move |request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        match body["method"].as_str() {
            Some("ping") => HttpReply::typed(
                200,
                "application/json",
                json!({"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32601, "message": "Method not found"}}).to_string(),
            ),
            Some("server/discover") => HttpReply::typed(400, "text/plain", "Bad Request"),
            _ => handler(request),
        }
    })
    .await;
    let client = McpClient::new(
        ServerConfig::new("old", server.url("/mcp")),
        f.egress.clone(),
    );
    let reply = client.send_request(Request::Health, None).await;
    assert!(
        matches!(&reply, Ok(Reply::Alive { protocol, probe }) if protocol == "2025-11-25" && probe == "tools/list"),
        "{reply:?}"
    );
}

#[tokio::test]
async fn an_answer_over_the_limit_is_refused_naming_its_size_and_the_setting_and_a_raised_limit_takes_it()
 {
    const SIZE: usize = 3 * 1024 * 1024;
    for flags in MODES {
        let peer = start(flags).await;
        let f = fixture().await;
        let client = McpClient::new(ServerConfig::new("peer", peer.url()), f.egress.clone());
        let refused = client
            .call_tool(call("big", json!({"size": SIZE})), None)
            .await;
        assert_eq!(refused.result.outcome, ToolOutcome::Failed, "{flags:?}");
        let text = &refused.result.text;
        assert!(
            text.contains("over its max_response_bytes of 2097152 bytes")
                && text.contains("raise max_response_bytes in [mcp.servers.peer]"),
            "{flags:?}: {text}"
        );
        assert!(!text.contains("xxxxxxxx"), "none of the answer is echoed");
        // The server ran the write and had begun its answer: answered, not uncertain.
        assert_eq!(
            refused.result.delivery,
            Delivery::Answered,
            "{flags:?}: {text}"
        );
        if flags.contains(&"--json-response") {
            assert!(
                text.contains("with 629"),
                "a declared size is named: {text}"
            );
        }
        assert_eq!(stats(&peer)["calls"]["big"], 1);

        let mut raised = ServerConfig::new("peer", peer.url());
        // The SDK sends the text twice (content and structuredContent): about 6 MiB.
        raised.max_response_bytes = 8 * 1024 * 1024;
        let client = McpClient::new(raised, f.egress.clone());
        let taken = client
            .call_tool(call("big", json!({"size": SIZE})), None)
            .await;
        assert!(
            taken.result.is_success(),
            "{flags:?}: {}",
            taken.result.text
        );
        assert_eq!(taken.result.text.len(), SIZE);
    }
}

#[tokio::test]
async fn a_one_second_budget_reaches_a_real_server_and_a_refused_host_is_reported_as_refused() {
    for flags in MODES {
        let peer = start(flags).await;
        let f = fixture().await;
        let mut config = ServerConfig::new("peer", peer.url());
        config.timeout = Duration::from_secs(1);
        let client = McpClient::new(config, f.egress.clone());
        let echoed = client
            .call_tool(call("echo", json!({"text": "in time"})), None)
            .await;
        assert_eq!(
            echoed.result.text, "in time",
            "{flags:?}: {}",
            echoed.result.text
        );
        let spent: Duration = echoed.legs.iter().map(|l| l.granted).max().unwrap();
        assert!(
            spent <= Duration::from_secs(1),
            "no leg is granted past the budget"
        );
    }
    // The guard refuses anything but loopback: the refusal is what the operator reads.
    let f = fixture().await;
    let mut config = ServerConfig::new("far", "http://169.254.169.254/mcp");
    config.timeout = Duration::from_secs(1);
    let client = McpClient::new(config, f.egress.clone());
    let refused = client.call_tool(call("echo", json!({})), None).await;
    assert!(
        !matches!(refused.result.error, Some(McpError::NotSent { .. })),
        "{}",
        refused.result.text
    );
    assert!(
        matches!(refused.result.error, Some(McpError::Egress { .. })),
        "{}",
        refused.result.text
    );
    assert_eq!(refused.result.delivery, Delivery::NotSent);
}

#[tokio::test]
async fn the_delete_that_ends_a_session_carries_the_run_tag() {
    let peer = start(&[]).await;
    let f = fixture().await;
    let client = McpClient::new(
        ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    );
    let mut request = call("echo", json!({"text": "x"}));
    request.correlation = Some("run-7".into());
    assert!(client.call_tool(request, None).await.result.is_success());
    client.close().await.unwrap();
    let rows = f.audit().await;
    let delete = rows
        .iter()
        .rev()
        .find(|r| r.event.method == "DELETE")
        .expect("the session was ended with DELETE");
    assert_eq!(delete.event.correlation.as_deref(), Some("run-7"));
}

async fn start_v1(flags: &'static [&'static str]) -> Peer {
    tokio::task::spawn_blocking(move || Peer::start_v1(flags))
        .await
        .unwrap()
}

/// The Python SDK 1.x, stateful with sessions, as servers people still run are: health by
/// `ping` after the probe fell back, a cancel that closes the connection (the server stops
/// the work), the size limit both ways.
#[tokio::test]
async fn the_python_sdk_1_is_probed_cancelled_and_size_limited() {
    const SIZE: usize = 3 * 1024 * 1024;
    for flags in [&[][..], &["--json-response"][..]] {
        let peer = start_v1(flags).await;
        let f = fixture().await;
        let client = Arc::new(McpClient::new(
            ServerConfig::new("old", peer.url()),
            f.egress.clone(),
        ));
        let reply = client.send_request(Request::Health, None).await;
        assert!(
            matches!(&reply, Ok(Reply::Alive { protocol, probe }) if protocol == "2025-11-25" && probe == "ping"),
            "{flags:?}: {reply:?}"
        );
        let refused = client
            .call_tool(call("big", json!({"size": SIZE})), None)
            .await;
        assert!(
            refused
                .result
                .text
                .contains("over its max_response_bytes of 2097152 bytes"),
            "{flags:?}: {}",
            refused.result.text
        );
        assert_eq!(refused.result.delivery, Delivery::Answered, "{flags:?}");

        let flag = runwarden_vault::CancelFlag::new();
        let (task_client, task_flag) = (client.clone(), flag.clone());
        let task = tokio::spawn(async move {
            task_client
                .call_tool(call("slow", json!({"seconds": 30.0})), Some(&task_flag))
                .await
        });
        crate::peer::wait_for_stats(&peer, |s| s["slow_started"] == 1).await;
        flag.cancel();
        let outcome = tokio::time::timeout(crate::support::WAIT, task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(outcome.result.outcome, ToolOutcome::Cancelled);
        let after = crate::peer::wait_for_stats(&peer, |s| s["slow_cancelled"] == 1).await;
        assert_eq!(
            after["slow_completed"], 0,
            "{flags:?}: the server stopped the work"
        );
        client.close().await.unwrap();

        let mut raised = ServerConfig::new("old", peer.url());
        raised.max_response_bytes = 8 * 1024 * 1024;
        let client = McpClient::new(raised, f.egress.clone());
        let taken = client
            .call_tool(call("big", json!({"size": SIZE})), None)
            .await;
        assert!(
            taken.result.is_success(),
            "{flags:?}: {}",
            taken.result.text
        );
        assert_eq!(taken.result.text.len(), SIZE);
        client.close().await.unwrap();
    }
}
