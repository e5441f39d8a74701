//! Interop through the binary against fastmcp, the most used Python MCP server framework
//! (pinned beside the official SDK it builds on, `tests/peer/fastmcp_server.py`; it offers
//! 2026-07-28, so it is spoken to statelessly): health by `server/discover`, import, a call with a structured result, Ctrl-C closing the connection (the server's
//! handler sees the disconnect), and local refusals that leave the server's count of
//! tools/call requests unchanged, for an imported server and for one never imported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::Peer;
use serde_json::Value;

use crate::support::{Live, Sandbox, runwarden};

/// How long the peer's counters may take to move after the client acted.
const WAIT: Duration = Duration::from_secs(10);

async fn fastmcp() -> Peer {
    tokio::task::spawn_blocking(Peer::start_fastmcp)
        .await
        .unwrap()
}

/// A sandbox that allows loopback and declares server `fm` at the peer.
fn sandbox(peer: &Peer) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!("\n[mcp.servers.fm]\nurl = \"{}\"\n", peer.url()));
    Arc::new(sandbox)
}

/// Every tools/call that reached the server, for a tool it has or not.
fn tool_calls(peer: &Peer) -> u64 {
    peer.stats_json()["tool_calls"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_is_healthy_imported_called_cancelled_and_an_unknown_tool_refused_locally() {
    let peer = fastmcp().await;
    let sandbox = sandbox(&peer);
    let health = runwarden(&sandbox, &["--json", "mcp", "health"])
        .await
        .ok()
        .json();
    assert_eq!(health[0]["up"], true, "{health}");
    assert_eq!(health[0]["protocol"], "2026-07-28", "{health}");
    assert_eq!(health[0]["probe"], "server/discover", "{health}");
    runwarden(&sandbox, &["mcp", "import", "fm"])
        .await
        .ok()
        .says("imported 3 tools from fm (0 refused)");

    let added = runwarden(
        &sandbox,
        &[
            "--json",
            "mcp",
            "call",
            "fm",
            "fm__add",
            "--args",
            r#"{"a":2,"b":3}"#,
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(added["outcome"], "succeeded", "{added}");
    assert_eq!(added["structured"]["sum"], 5, "{added}");
    assert_eq!(tool_calls(&peer), 1);

    // Ctrl-C while the call is on the wire: the command exits 130 at once and the
    // server's handler is cancelled by the closed connection, never run to its end.
    let mut live = Live::start(
        &sandbox,
        &[
            "mcp",
            "call",
            "fm",
            "fm__slow",
            "--args",
            r#"{"seconds":30}"#,
        ],
    );
    peer.wait_for_stats(WAIT, |s| s["slow_started"] == 1).await;
    let pressed = Instant::now();
    live.signal("INT");
    let ended = live.ended(pressed, Duration::from_secs(5)).await;
    assert_eq!(ended.code, Some(130), "{ended:#?}");
    let after = peer
        .wait_for_stats(WAIT, |s| s["slow_cancelled"] == 1)
        .await;
    assert_eq!(
        after["slow_completed"], 0,
        "the server stopped the work: {after}"
    );

    let before = tool_calls(&peer);
    runwarden(
        &sandbox,
        &["mcp", "call", "fm", "ech", "--args", r#"{"text":"x"}"#],
    )
    .await
    .fails()
    .says("server fm offers no tool \"ech\" (did you mean echo?)")
    .says("nothing was sent");
    assert_eq!(tool_calls(&peer), before, "the server saw no call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_server_never_imported_is_checked_against_its_tools_listed_live() {
    let peer = fastmcp().await;
    let sandbox = sandbox(&peer);
    let refused = runwarden(
        &sandbox,
        &["mcp", "call", "fm", "ech", "--args", r#"{"text":"x"}"#],
    )
    .await
    .fails()
    .says("server fm offers no tool \"ech\" (did you mean echo?); nothing was sent")
    .says("server fm was never imported, so its tools were listed live")
    .says("`runwarden mcp import fm`")
    .says("pass --force");
    assert_eq!(refused.code, Some(1), "{refused:#?}");
    assert_eq!(tool_calls(&peer), 0, "the server saw no call");
    let listed = runwarden(&sandbox, &["--json", "mcp", "list", "fm"])
        .await
        .ok()
        .json();
    assert!(
        listed.to_string().contains("\"tools\":[]"),
        "the live listing is not stored as an import: {listed}"
    );

    // A tool it lists goes through, by its remote name or its local one.
    runwarden(
        &sandbox,
        &["mcp", "call", "fm", "echo", "--args", r#"{"text":"hi"}"#],
    )
    .await
    .ok()
    .says("hi");
    runwarden(
        &sandbox,
        &[
            "mcp",
            "call",
            "fm",
            "fm__echo",
            "--args",
            r#"{"text":"hi"}"#,
        ],
    )
    .await
    .ok();
    assert_eq!(tool_calls(&peer), 2);

    // --force sends it unchecked, and the audit rows say so.
    runwarden(
        &sandbox,
        &[
            "mcp",
            "call",
            "fm",
            "ech",
            "--force",
            "--args",
            r#"{"text":"x"}"#,
        ],
    )
    .await
    .fails()
    .says("Unknown tool");
    assert_eq!(tool_calls(&peer), 3, "the forced call reached the server");
    let rows = runwarden(&sandbox, &["--json", "audit", "list"])
        .await
        .ok()
        .json();
    let forced = rows.as_array().unwrap().iter().any(|r: &Value| {
        r["reason"]
            .as_str()
            .is_some_and(|t| t.contains("tools/call, forced past the catalogue"))
    });
    assert!(forced, "the forced call's rows say so: {rows}");
}
