//! M11: each operation records the server's liveness; a cancellation records nothing.

use std::sync::Arc;

use runwarden_mcp::{CatalogueStore, McpClient, ProtocolPolicy, Request, ServerConfig};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{HttpReply, TestServer, mcp_handler, tool};
use runwarden_vault::CancelFlag;

use crate::support::fixture;

#[tokio::test]
async fn success_and_failure_are_recorded_and_a_cancellation_is_not() {
    let f = fixture().await;
    let store = Arc::new(SqliteStore::open(f.dir.path().join("runwarden.db")).unwrap());
    let up = TestServer::start(mcp_handler(vec![tool("search")], &[])).await;
    let down = TestServer::start(|_| HttpReply::text(500, "broken")).await;
    let client = |name: &str, url: String| {
        McpClient::new(
            ServerConfig::new(name, url).with_protocol(ProtocolPolicy::Handshake),
            f.egress.clone(),
        )
        .with_health(store.clone())
    };

    client("up", up.url("/mcp"))
        .send_request(Request::ListTools, None)
        .await
        .unwrap();
    client("down", down.url("/mcp"))
        .send_request(Request::Ping, None)
        .await
        .unwrap_err();
    let flag = CancelFlag::new();
    flag.cancel();
    client("cancelled", up.url("/mcp"))
        .send_request(Request::Ping, Some(&flag))
        .await
        .unwrap_err();

    let health = store.health_list().await.unwrap();
    let names: Vec<&str> = health.iter().map(|h| h.server.as_str()).collect();
    assert_eq!(
        names,
        ["down", "up"],
        "a cancellation says nothing about the server"
    );
    assert!(health[1].last_success_ms.is_some() && health[1].last_failure_ms.is_none());
    assert!(health[0].last_success_ms.is_none());
    assert!(
        health[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("HTTP 500")
    );
}
