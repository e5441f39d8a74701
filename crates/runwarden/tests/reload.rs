//! `serve` reloads its agents, MCP servers and limits on SIGHUP and logs what changed; a file
//! that does not load keeps the previous configuration in force. Waits are on the log
//! lines the server writes, never on a guessed sleep.

use serde_json::{Value, json};

use crate::support::serve::token;
use crate::support::{Live, Sandbox};

/// `POST /v1/runs` for `agent`: the status and the body.
async fn enqueue(url: &str, token: &str, agent: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{url}/v1/runs"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(json!({"agent": agent, "prompt": "hello"}).to_string())
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap())
}

/// Reads the server's stderr until a line holding `needle`.
async fn until_logged(serve: &mut Live, needle: &str) -> String {
    loop {
        let line = serve.err_line().await;
        if line.contains(needle) {
            return line;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_puts_an_added_agent_in_force_and_a_bad_file_keeps_the_old_one() {
    let sandbox = std::sync::Arc::new(Sandbox::initialised());
    sandbox.append_config("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(
        sandbox.path().join("plan.json"),
        json!([{"text": "done"}]).to_string(),
    )
    .unwrap();
    let operator = token(&sandbox, "operator").await;
    let mut command = sandbox.command(&[
        "--json",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--concurrency",
        "0",
    ]);
    command.env("RUNWARDEN_LOG", "info");
    let mut serve = Live::spawn(command);
    let ready = serve.json().await;
    let url = ready["url"].as_str().unwrap().to_string();

    let (code, refused) = enqueue(&url, &operator, "late").await;
    assert_eq!(
        (code, refused["error"]["code"].as_str()),
        (404, Some("agent_not_found"))
    );

    let good = std::fs::read_to_string(sandbox.config()).unwrap();
    sandbox.append_config("\n[agents.late]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    serve.signal("HUP");
    until_logged(&mut serve, "agent late added").await;
    let (code, run) = enqueue(&url, &operator, "late").await;
    assert_eq!(code, 202, "the reloaded agent is enqueued: {run}");
    assert_eq!(run["agent"], "late");

    // Limits reload with the rest, and the log says they hold from now on.
    sandbox.append_config("\n[limits.agents.late]\nconcurrency = 2\n");
    serve.signal("HUP");
    until_logged(&mut serve, "limits changed: in force for calls from now on").await;

    // A file that does not parse: logged, and the configuration in force stays.
    std::fs::write(sandbox.config(), format!("{good}\n[agents.broken\n")).unwrap();
    serve.signal("HUP");
    let line = until_logged(&mut serve, "did not reload").await;
    assert!(line.contains("previous one stays in force"), "{line}");
    let (code, _) = enqueue(&url, &operator, "late").await;
    assert_eq!(code, 202, "the last good configuration is still in force");
    assert!(!serve.has_exited(), "SIGHUP never stops serve");

    // Back to the file without `late`: it is removed, and says so.
    std::fs::write(sandbox.config(), good).unwrap();
    serve.signal("HUP");
    until_logged(&mut serve, "agent late removed").await;
    let (code, _) = enqueue(&url, &operator, "late").await;
    assert_eq!(code, 404);
}
