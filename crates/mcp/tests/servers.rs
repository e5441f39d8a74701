//! The client against scripted servers of each kind people run: the server's own error
//! words in an HTTP error body, what each server speaks remembered across clients, a
//! refused credential sent once, and a 2026 server that offers no tools. The same against
//! the official Python SDK is in the `peer` target.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use runwarden_mcp::{
    CatalogueStore, McpClient, McpError, ProtocolPolicy, Request, STATELESS_VERSION, ServerConfig,
    ToolOutcome,
};
use runwarden_testkit::{HttpReply, HttpRequest, TestServer, mcp_handler, tool};
use runwarden_vault::{Credential, Delivery, Placement, SecretName, SecretValue};
use serde_json::{Value, json};

use crate::support::{call, fixture, methods};

#[tokio::test]
async fn the_json_rpc_error_in_an_http_error_body_is_shown_with_the_protocol_and_the_legs() {
    let server = TestServer::start(|request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        HttpReply::typed(
            400,
            "application/json",
            json!({"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32600, "message": "Bad Request: missing the tenant header"}}).to_string(),
        )
    })
    .await;
    let f = fixture().await;
    let client = McpClient::new(
        ServerConfig::new("strict", server.url("/mcp")).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    );
    let called = client.call_tool(call("search", json!({})), None).await;
    let text = &called.result.text;
    assert!(
        text.contains("refused initialize with HTTP 400: JSON-RPC error -32600: Bad Request: missing the tenant header"),
        "{text}"
    );
    assert!(
        text.contains("(protocol not negotiated; tried initialize)"),
        "{text}"
    );
    assert!(
        matches!(
            called.result.error,
            Some(McpError::Rpc {
                status: Some(400),
                ..
            })
        ),
        "{:?}",
        called.result.error
    );
}

/// A 2025-11-25 server that refuses `server/discover` with HTTP 400, counting each method;
/// while `broken`, it answers `initialize` with HTTP 500.
fn counting_old_server(
    seen: Arc<std::sync::Mutex<Vec<String>>>,
    broken: Arc<std::sync::atomic::AtomicBool>,
) -> impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static {
    let handler = mcp_handler(vec![tool("search")], &[]);
    move |request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let method = body["method"].as_str().unwrap_or("GET").to_string();
        seen.lock().unwrap().push(method.clone());
        if method == "initialize" && broken.load(Ordering::SeqCst) {
            return HttpReply::typed(500, "text/plain", "down for maintenance");
        }
        if method == "server/discover" {
            return HttpReply::typed(
                400,
                "text/plain",
                "Bad Request: No valid session ID provided",
            );
        }
        handler(request)
    }
}

#[tokio::test]
async fn what_a_server_speaks_is_remembered_in_the_store_so_the_next_client_does_not_probe() {
    let vault = runwarden_testkit::loopback_vault().await;
    let store: Arc<dyn CatalogueStore> = Arc::new(vault.store.clone());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = TestServer::start(counting_old_server(seen.clone(), broken.clone())).await;
    let fresh = || {
        McpClient::new(
            ServerConfig::new("old", server.url("/mcp")),
            vault.egress.clone(),
        )
        .with_health(store.clone())
    };
    let first = fresh().call_tool(call("search", json!({})), None).await;
    assert!(first.result.is_success(), "{}", first.result.text);
    assert_eq!(methods(&first.legs)[0], "server/discover");
    let known = store.protocol_get("old").await.unwrap().unwrap();
    assert_eq!(known.protocol, "2025-11-25");
    // A new client (as a new process would be) goes straight to the handshake.
    let second = fresh().call_tool(call("search", json!({})), None).await;
    assert!(second.result.is_success(), "{}", second.result.text);
    assert_eq!(
        methods(&second.legs),
        ["initialize", "notifications/initialized", "tools/call"]
    );
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|m| *m == "server/discover")
            .count(),
        1
    );
    // A failure forgets it: the next client probes again.
    broken.store(true, Ordering::SeqCst);
    let failed = fresh().call_tool(call("search", json!({})), None).await;
    assert_eq!(failed.result.outcome, ToolOutcome::Failed);
    assert!(
        failed
            .result
            .text
            .contains("(protocol not negotiated; tried initialize)"),
        "{}",
        failed.result.text
    );
    assert_eq!(store.protocol_get("old").await.unwrap(), None);
    broken.store(false, Ordering::SeqCst);
    let fourth = fresh().call_tool(call("search", json!({})), None).await;
    assert_eq!(methods(&fourth.legs)[0], "server/discover");
}

#[tokio::test]
async fn a_2026_server_is_remembered_for_its_ttl_and_spoken_to_at_once() {
    let vault = runwarden_testkit::loopback_vault().await;
    let store: Arc<dyn CatalogueStore> = Arc::new(vault.store.clone());
    let discovers = Arc::new(AtomicUsize::new(0));
    let counted = discovers.clone();
    let server = TestServer::start(move |request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let result = match body["method"].as_str() {
            Some("server/discover") => {
                counted.fetch_add(1, Ordering::SeqCst);
                json!({"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "ttlMs": 60_000, "cacheScope": "public", "resultType": "complete"})
            }
            Some("tools/list") => json!({"tools": [tool("search")]}),
            Some("tools/call") => json!({"content": [{"type": "text", "text": "found"}]}),
            _ => json!({}),
        };
        HttpReply::typed(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string(),
        )
    })
    .await;
    for _ in 0..2 {
        let client = McpClient::new(
            ServerConfig::new("modern", server.url("/mcp")),
            vault.egress.clone(),
        )
        .with_health(store.clone());
        let called = client.call_tool(call("search", json!({})), None).await;
        assert!(called.result.is_success(), "{}", called.result.text);
        assert_eq!(called.protocol.as_deref(), Some(STATELESS_VERSION));
    }
    assert_eq!(
        discovers.load(Ordering::SeqCst),
        1,
        "the second client did not probe"
    );
    let known = store.protocol_get("modern").await.unwrap().unwrap();
    assert!(known.tools && known.protocol == STATELESS_VERSION);
}

#[tokio::test]
async fn a_refused_credential_is_sent_once() {
    let f = fixture().await;
    let name = SecretName::new("wrong-bearer").unwrap();
    f.vault
        .secret_put(&name, SecretValue::new(b"not-the-token".to_vec()))
        .await
        .unwrap();
    let mut server =
        TestServer::start(|_: &HttpRequest| HttpReply::typed(401, "text/plain", "Unauthorized"))
            .await;
    let mut config = ServerConfig::new("locked", server.url("/mcp"));
    config.auth = Some(Credential {
        secret: name,
        placement: Placement::Bearer,
    });
    let client = McpClient::new(config, f.egress.clone());
    let called = client.call_tool(call("search", json!({})), None).await;
    assert_eq!(
        called.result.delivery,
        Delivery::NotSent,
        "no tools/call went out"
    );
    assert!(
        called.result.text.contains("answered HTTP 401 to server/discover; it refused the credential, which is not sent again"),
        "{}",
        called.result.text
    );
    let with_bearer = server
        .drain_requests()
        .iter()
        .filter(|r| r.header("authorization").is_some())
        .count();
    assert_eq!(with_bearer, 1, "the rejected bearer went out once");
}

#[tokio::test]
async fn a_2026_server_without_tools_is_said_so_by_its_discover_result_not_by_initialize() {
    let server = TestServer::start(|request: &HttpRequest| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let result = json!({"supportedVersions": ["2026-07-28"], "capabilities": {"prompts": {}}, "ttlMs": 0, "cacheScope": "public", "resultType": "complete"});
        HttpReply::typed(
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string(),
        )
    })
    .await;
    let f = fixture().await;
    let client = McpClient::new(
        ServerConfig::new("prompts", server.url("/mcp")),
        f.egress.clone(),
    );
    let error = client
        .send_request(Request::ListTools, None)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "server prompts offers no tools (its server/discover result at protocol 2026-07-28 has no tools capability)"
    );
}
