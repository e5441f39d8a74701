//! The sandbox of a local server, with the official Python SDK's stdio server inside it:
//! its only way out is the vault's egress proxy, where every connection is guarded and
//! audited; anything else has nowhere to go. Needs user and network namespaces (this
//! machine, as CI runs it, allows them).

use std::path::Path;
use std::sync::atomic::Ordering;

use runwarden_mcp::stdio::{EnvValue, SandboxMode, StdioConfig};
use runwarden_mcp::{McpClient, ServerConfig};
use runwarden_testkit::{HttpReply, TestServer};
use serde_json::json;

use crate::support::{Fixture, call, fixture};

fn sandboxed(f: &Fixture, events: &Path, memory_mb: Option<u64>) -> McpClient {
    let (python, script) = runwarden_testkit::stdio_peer();
    let mut stdio = StdioConfig::new(python, script);
    assert_eq!(
        stdio.sandbox,
        SandboxMode::Namespace,
        "sandboxed by default"
    );
    stdio.env.insert(
        "PEER_EVENTS".into(),
        EnvValue::Literal(events.display().to_string()),
    );
    if let Some(mb) = memory_mb {
        stdio.limits.memory_mb = mb;
    }
    McpClient::new(ServerConfig::local("boxed", stdio), f.egress.clone())
}

async fn text(client: &McpClient, tool: &str, arguments: serde_json::Value) -> String {
    client
        .call_tool(call(tool, arguments), None)
        .await
        .result
        .text
}

#[tokio::test]
async fn a_sandboxed_server_reaches_only_what_the_proxy_allows_and_each_try_is_audited() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let client = sandboxed(&f, &dir.path().join("events"), None);
    let host = TestServer::start(|_| HttpReply::text(200, "hello from the host")).await;
    let port = host.addr.port();

    // Directly: the host's loopback port is not its loopback, and no other address is
    // reachable. Nothing reached the host's server.
    let direct = text(
        &client,
        "connect",
        json!({"host": "127.0.0.1", "port": port}),
    )
    .await;
    assert!(direct.starts_with("failed"), "{direct}");
    for address in ["10.1.2.3", "169.254.169.254"] {
        let direct = text(&client, "connect", json!({"host": address, "port": 80})).await;
        assert!(direct.starts_with("failed"), "{address}: {direct}");
    }
    assert_eq!(host.connections.load(Ordering::SeqCst), 0);

    // Through the proxy: the allowed host is reached, with its rows.
    let url = format!("http://127.0.0.1:{port}/greeting");
    let reached = text(&client, "fetch", json!({"url": url})).await;
    assert_eq!(reached, "200 hello from the host");
    assert_eq!(host.connections.load(Ordering::SeqCst), 1);
    // A private and a metadata address are refused, each with a row, and never reached.
    for address in ["10.1.2.3", "169.254.169.254"] {
        let refused = text(
            &client,
            "fetch",
            json!({"url": format!("http://{address}/")}),
        )
        .await;
        assert!(refused.starts_with("403"), "{address}: {refused}");
    }
    let rows = f.vault.audit_list(Default::default()).await.unwrap();
    let proxied: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|r| r.event.action.starts_with("proxy_"))
        .map(|r| {
            (
                r.event.action.as_str(),
                r.event.host.as_str(),
                r.event.actor.as_str(),
            )
        })
        .collect();
    let host_port = format!("127.0.0.1:{port}");
    assert_eq!(
        proxied,
        [
            ("proxy_request_started", host_port.as_str(), "mcp:boxed"),
            ("proxy_request", host_port.as_str(), "mcp:boxed"),
            ("proxy_request_refused", "10.1.2.3:80", "mcp:boxed"),
            ("proxy_request_refused", "169.254.169.254:80", "mcp:boxed"),
        ],
        "{rows:#?}"
    );
    client.close().await.unwrap();
}

#[tokio::test]
async fn a_sandboxed_server_over_its_memory_limit_is_stopped_with_the_reason() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let client = sandboxed(&f, &dir.path().join("events"), Some(160));
    let outcome = client
        .call_tool(call("hog", json!({"megabytes": 512, "seconds": 30})), None)
        .await;
    let text = outcome.result.text;
    assert!(outcome.result.error.is_some(), "{text}");
    assert!(text.contains("over its memory limit of 160 MiB"), "{text}");
    // It starts again for the next call.
    assert_eq!(
        self::text(&client, "echo", json!({"text": "back"})).await,
        "back"
    );
    client.close().await.unwrap();
}
