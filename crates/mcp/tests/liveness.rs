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

#[tokio::test]
async fn a_busy_servers_successes_are_written_once_a_second_and_the_first_after_a_failure_at_once()
{
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = fixture().await;
    let store = Arc::new(SqliteStore::open(f.dir.path().join("runwarden.db")).unwrap());
    let broken = Arc::new(AtomicBool::new(false));
    let handler = mcp_handler(vec![tool("search")], &[]);
    let failing = broken.clone();
    let server = TestServer::start(move |request: &runwarden_testkit::HttpRequest| {
        if failing.load(Ordering::SeqCst) {
            HttpReply::text(500, "broken")
        } else {
            handler(request)
        }
    })
    .await;
    let client = McpClient::new(
        ServerConfig::new("busy", server.url("/mcp")).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    )
    .with_health(store.clone());
    let success = || async {
        store.health_list().await.unwrap()[0]
            .last_success_ms
            .expect("a success is recorded")
    };

    let started = std::time::Instant::now();
    client.send_request(Request::ListTools, None).await.unwrap();
    let first = success().await;
    for _ in 0..10 {
        client.send_request(Request::ListTools, None).await.unwrap();
    }
    if started.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(
            success().await,
            first,
            "successes within a second are not written again"
        );
    }

    broken.store(true, Ordering::SeqCst);
    client.send_request(Request::Ping, None).await.unwrap_err();
    broken.store(false, Ordering::SeqCst);
    let failed = store.health_list().await.unwrap()[0]
        .last_failure_ms
        .expect("the failure is recorded at once");
    client.send_request(Request::Ping, None).await.unwrap();
    let after = success().await;
    assert!(
        after >= failed && after > first,
        "the success after a failure is written at once: {first} {failed} {after}"
    );
}
