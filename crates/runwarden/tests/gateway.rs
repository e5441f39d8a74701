//! The MCP gateway's HTTP face, with a plain HTTP client and `runwarden-testkit`'s MCP
//! server behind it (no SDK needed; the SDKs' clients are in `peer/gateway.rs`): how a
//! client without a token learns where to authenticate, that a session belongs to the
//! token that opened it, and that a session's run settles when the client ends it or the
//! server stops.

use std::sync::Arc;
use std::time::Duration;

use runwarden_testkit::{TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::serve::{Api, Serve, named_token};
use crate::support::workers::status;
use crate::support::{Sandbox, runwarden};

/// An installation whose gateway lets tokens `ide` and `other` call `srv__*`, served.
async fn install(mcp: &TestServer) -> (Arc<Sandbox>, Serve) {
    let tokens = "[gateway.tokens.ide]\ntools = [\"srv__*\"]\n\n[gateway.tokens.other]\ntools = [\"srv__*\"]\n";
    install_with(mcp, tokens).await
}

/// An installation with `mcp` imported as read-only `srv` and the `tokens` sections, served.
async fn install_with(mcp: &TestServer, tokens: &str) -> (Arc<Sandbox>, Serve) {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\neffect = \"read_only\"\n\n{tokens}",
        mcp.url("/mcp")
    ));
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    let serve = Serve::start(&sandbox, 1).await;
    (sandbox, serve)
}

/// One POST to `/mcp`: the status, the session header, the body.
async fn post(
    serve: &Serve,
    token: Option<&str>,
    session: Option<&str>,
    body: Value,
) -> (u16, Option<String>, Value, reqwest::header::HeaderMap) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/mcp", serve.url()))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let answer = request.send().await.expect("serve answers");
    let status = answer.status().as_u16();
    let headers = answer.headers().clone();
    let session = headers
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let text = answer.text().await.unwrap();
    (
        status,
        session,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    )
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "plain", "version": "1"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_token_is_pointed_at_the_resource_metadata() {
    let mcp = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let (_sandbox, serve) = install(&mcp).await;
    let (status, _, body, headers) = post(&serve, None, None, initialize()).await;
    assert_eq!(status, 401, "{body}");
    let challenge = headers["www-authenticate"].to_str().unwrap();
    let metadata = format!("{}/.well-known/oauth-protected-resource/mcp", serve.url());
    assert_eq!(
        challenge,
        format!("Bearer resource_metadata=\"{metadata}\"")
    );
    let document = reqwest::get(&metadata).await.unwrap().text().await.unwrap();
    let document: Value = serde_json::from_str(&document).unwrap();
    assert_eq!(document["resource"], format!("{}/mcp", serve.url()));
    assert_eq!(document["bearer_methods_supported"], json!(["header"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_belongs_to_its_token_and_its_run_completes_when_the_client_ends_it() {
    let mcp = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let (sandbox, serve) = install(&mcp).await;
    let ide = named_token(&sandbox, "operator", "ide").await;
    let other = named_token(&sandbox, "operator", "other").await;
    let (status, session, body, _) = post(&serve, Some(&ide), None, initialize()).await;
    assert_eq!(status, 200, "{body}");
    let session = session.expect("a session id");
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _, body, _) = post(&serve, Some(&other), Some(&session), list.clone()).await;
    assert_eq!(status, 404, "another token's session is not found: {body}");
    let (status, _, body, _) = post(&serve, Some(&ide), Some(&session), list).await;
    assert_eq!(status, 200);
    assert_eq!(body["result"]["tools"][0]["name"], "srv__echo", "{body}");
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "srv__echo", "arguments": {"q": "hi"}}});
    let (_, _, body, _) = post(&serve, Some(&ide), Some(&session), call).await;
    assert_eq!(
        body["result"]["content"][0]["text"], "echo {\"q\":\"hi\"}",
        "{body}"
    );

    let ended = reqwest::Client::new()
        .delete(format!("{}/mcp", serve.url()))
        .bearer_auth(&ide)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status().as_u16(), 204);
    let run = settled(&sandbox, &session).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(
        run["termination_reason"],
        "the client ended its session after 1 tool call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_settles_the_runs_of_its_open_sessions() {
    let mcp = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let (sandbox, mut serve) = install(&mcp).await;
    let ide = named_token(&sandbox, "operator", "ide").await;
    let (_, session, _, _) = post(&serve, Some(&ide), None, initialize()).await;
    let session = session.expect("a session id");
    // A client holding its standing stream does not hold the stop up.
    let _standing = standing_stream(&serve, &ide, &session).await;
    serve.signal("TERM");
    let waiting = tokio::task::spawn_blocking(move || serve.child.wait());
    let exited = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("serve stops within 30 s")
        .unwrap();
    assert!(exited.unwrap().success());
    let run = status(&sandbox, &session).await;
    assert_eq!(run["status"], "completed", "{run:#}");
}

/// The session's standing `GET /mcp` stream, open.
async fn standing_stream(serve: &Serve, token: &str, session: &str) -> reqwest::Response {
    let stream = reqwest::Client::new()
        .get(format!("{}/mcp", serve.url()))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    stream
}

/// The run of a session once it is no longer running (the session's id is its run's).
async fn settled(sandbox: &Arc<Sandbox>, run_id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let run = status(sandbox, run_id).await;
        if run["status"] != "running" {
            return run;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {run:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_holds_at_most_64_open_sessions_and_another_token_is_not_held_back() {
    let mcp = TestServer::start(mcp_handler(vec![tool("echo")], &[])).await;
    let (sandbox, serve) = install(&mcp).await;
    let ide = named_token(&sandbox, "operator", "ide").await;
    let other = named_token(&sandbox, "operator", "other").await;
    for _ in 0..64 {
        let (status, _, body, _) = post(&serve, Some(&ide), None, initialize()).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _, body, _) = post(&serve, Some(&ide), None, initialize()).await;
    assert_eq!(status, 429, "{body}");
    let said = body["error"]["message"].as_str().unwrap();
    assert!(said.contains("end one"), "{said}");
    let (status, _, _, _) = post(&serve, Some(&other), None, initialize()).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_a_tokens_tools_is_announced_and_the_session_can_call_them() {
    let mcp = TestServer::start(mcp_handler(vec![tool("echo"), tool("add")], &[])).await;
    let tokens = "[gateway.tokens.ide]\ntools = [\"srv__echo\"]\n";
    let (sandbox, serve) = install_with(&mcp, tokens).await;
    let ide = named_token(&sandbox, "operator", "ide").await;
    let (_, session, body, _) = post(&serve, Some(&ide), None, initialize()).await;
    assert_eq!(body["result"]["capabilities"]["tools"]["listChanged"], true);
    let session = session.expect("a session id");
    let mut stream = standing_stream(&serve, &ide, &session).await;

    let config = std::fs::read_to_string(sandbox.config()).unwrap();
    let widened = config.replace("tools = [\"srv__echo\"]", "tools = [\"srv__*\"]");
    std::fs::write(sandbox.config(), widened).unwrap();
    serve.signal("HUP");
    let mut seen = String::new();
    let announced = tokio::time::timeout(Duration::from_secs(20), async {
        while !seen.contains("notifications/tools/list_changed") {
            let chunk = stream
                .chunk()
                .await
                .unwrap()
                .expect("the stream stays open");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(announced.is_ok(), "no list_changed: {seen}");

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (_, _, body, _) = post(&serve, Some(&ide), Some(&session), list).await;
    let names: Vec<&str> = body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["srv__add", "srv__echo"], "{body}");
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "srv__add", "arguments": {"q": "1"}}});
    let (_, _, body, _) = post(&serve, Some(&ide), Some(&session), call).await;
    assert_eq!(body["result"]["isError"], false, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cancels_one_call_of_a_session_and_the_session_goes_on() {
    let mcp = TestServer::start(mcp_handler(vec![tool("echo"), tool("stall")], &["stall"])).await;
    let (sandbox, serve) = install(&mcp).await;
    let ide = named_token(&sandbox, "operator", "ide").await;
    let (_, session, _, _) = post(&serve, Some(&ide), None, initialize()).await;
    let session = session.expect("a session id");
    let stalled = {
        let (url, ide, session) = (serve.url(), ide.clone(), session.clone());
        tokio::spawn(async move {
            let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "srv__stall", "arguments": {}}});
            let answer = reqwest::Client::new()
                .post(format!("{url}/mcp"))
                .bearer_auth(&ide)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .header("mcp-session-id", &session)
                .body(call.to_string())
                .send()
                .await
                .unwrap();
            serde_json::from_str::<Value>(&answer.text().await.unwrap()).unwrap()
        })
    };
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let listed = Api::new(&serve)
            .get(&format!("/v1/runs/{session}/calls"), &ide)
            .await;
        if listed["calls"][0]["call_id"] == "gw-7" {
            assert_eq!(listed["calls"][0]["tool"], "srv__stall");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never open: {listed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unknown = http
        .post(format!(
            "{}/v1/runs/{session}/calls/gw-8/cancel",
            serve.url()
        ))
        .bearer_auth(&ide)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status().as_u16(), 404);
    // On the store alone the CLI cannot: only the server holding the session knows it.
    let args = ["cancel", session.as_str(), "--call", "gw-7"];
    let refused = runwarden(&sandbox, &args).await.fails();
    assert!(refused.all().contains("add --server URL"), "{refused:#?}");
    let mut command = sandbox.command(&args);
    command
        .env("RUNWARDEN_SERVER", serve.url())
        .env("RUNWARDEN_TOKEN", &ide);
    let through = sandbox.clone();
    let cancelled = tokio::task::spawn_blocking(move || through.run_command(command))
        .await
        .unwrap()
        .ok();
    assert!(
        cancelled.all().contains("cancelled call gw-7"),
        "{cancelled:#?}"
    );
    let answer = tokio::time::timeout(Duration::from_secs(20), stalled)
        .await
        .expect("the call ends at once")
        .unwrap();
    assert_eq!(answer["error"]["code"], -32800, "{answer}");
    let said = answer["error"]["message"].as_str().unwrap();
    assert!(said.starts_with("cancelled by an operator"), "{said}");
    let echo = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "srv__echo", "arguments": {"q": "still here"}}});
    let (status, _, body, _) = post(&serve, Some(&ide), Some(&session), echo).await;
    assert_eq!(status, 200, "the session goes on: {body}");
    assert_eq!(body["result"]["isError"], false, "{body}");
    assert_eq!(status_of(&sandbox, &session).await, "running");
}

async fn status_of(sandbox: &Arc<Sandbox>, run_id: &str) -> String {
    status(sandbox, run_id).await["status"]
        .as_str()
        .unwrap()
        .to_string()
}
