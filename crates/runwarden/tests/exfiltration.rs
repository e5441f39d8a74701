//! No secret leaves for a host it does not belong to, through a real run: a scripted agent
//! writes the model's API key and another server's credential into the arguments of calls
//! to a real MCP server. Each call is refused before a byte is sent (`secret_exfiltration`),
//! the run's events and the audit say which secret and which host, the agent's next turn
//! sees a tool error, and the values appear in no event, audit row or output.

use runwarden_testkit::{HttpRequest, TestServer, forms_of, json_decoded, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::{Output, SIGIL, Sandbox, runwarden};

/// The model's API key: `/` and `+` make its JSON and percent-encoded forms differ.
const MODEL_KEY: &str = "sk-exfil/3f9a+1c7e-model";
/// The credential of server `other`, never meant for `srv`.
const OTHER_TOKEN: &str = "oc-8d2e5a/77+other-server";

fn is_call(request: &HttpRequest) -> bool {
    serde_json::from_slice::<Value>(&request.body).unwrap_or(Value::Null)["method"] == "tools/call"
}

/// True when `text` holds `secret` in any spelling, raw or JSON-decoded.
fn leaked(text: &str, secret: &str) -> bool {
    let decoded = json_decoded(text);
    forms_of(secret)
        .iter()
        .any(|f| text.contains(f.as_str()) || decoded.contains(f.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_tool_call_carries_another_secret_is_refused_before_sending_and_says_why() {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.put("srv-token", SIGIL);
    sandbox.put("model-key", MODEL_KEY);
    sandbox.put("other-token", OTHER_TOKEN);
    let percent: String = url::form_urlencoded::byte_serialize(OTHER_TOKEN.as_bytes()).collect();
    // The key in a string, the credential deep in an object, then percent-encoded in a URL.
    let plan = json!([
        {"tool_calls": [{"name": "srv__create", "arguments": {"title": MODEL_KEY}}]},
        {"tool_calls": [{"name": "srv__create", "arguments": {"note": {"lines": [format!("see {OTHER_TOKEN}")]}}}]},
        {"tool_calls": [{"name": "srv__create", "arguments": {"link": format!("https://x.example/?k={percent}")}}]},
        {"text": "done"}
    ]);
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\nauth = {{ secret = \"srv-token\", placement = \"bearer\" }}\n\n[mcp.servers.other]\nurl = \"http://127.0.0.1:9/mcp\"\nauth = {{ secret = \"other-token\", placement = \"bearer\" }}\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n\n[agents.m]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_secret = \"model-key\"\n",
        mcp.url("/mcp")
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("plan.json"), plan.to_string()).unwrap();
    let sandbox = std::sync::Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    mcp.drain_requests();

    let mut outputs: Vec<Output> = Vec::new();
    let run = runwarden(
        &sandbox,
        &["--json", "run", "--agent", "a", "open a ticket"],
    )
    .await
    .ok();
    let run_id = run.stdout.lines().next().and_then(|l| {
        serde_json::from_str::<Value>(l).ok()?["run_id"]
            .as_str()
            .map(str::to_string)
    });
    let run_id = run_id.unwrap_or_else(|| panic!("the run names itself: {run:#?}"));
    outputs.push(run);

    // Nothing reached the server's tool.
    let seen = mcp.drain_requests();
    assert_eq!(seen.iter().filter(|r| is_call(r)).count(), 0, "{seen:#?}");

    let events = runwarden(&sandbox, &["--json", "events", &run_id])
        .await
        .ok();
    let lines: Vec<Value> = events
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Each call stands refused in the model's turn, its arguments dropped; the agent's
    // next turn gets the refusal as the tool's error, naming the secret, never its value.
    let expected = ["model-key", "other-token", "other-token"];
    let responses: Vec<&Value> = lines
        .iter()
        .filter(|e| e["kind"] == "model_response")
        .collect();
    let results: Vec<&Value> = lines
        .iter()
        .filter(|e| e["kind"] == "tool_executed")
        .collect();
    assert_eq!(results.len(), expected.len(), "{events:#?}");
    for (i, secret) in expected.iter().enumerate() {
        let call = &responses[i]["payload"]["tool_calls"][0];
        assert_eq!(call["arguments"], Value::Null, "{call}");
        let result = &results[i]["payload"];
        assert_eq!(result["outcome"], "refused", "{result}");
        let text = result["text"].as_str().unwrap();
        assert!(
            text.contains("(secret_exfiltration)")
                && text.contains(&format!("secret \"{secret}\""))
                && text.contains("srv__create"),
            "{text}"
        );
    }
    let last = lines.last().unwrap();
    assert_eq!(
        last["kind"], "run_completed",
        "the plan went on after the errors"
    );

    let audit = runwarden(&sandbox, &["--json", "audit", "list"]).await.ok();
    let rows = audit.json();
    let refused: Vec<&Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "http_call_refused")
        .collect();
    let mut named: Vec<&str> = refused
        .iter()
        .map(|r| r["secret"].as_str().unwrap())
        .collect();
    named.sort();
    assert_eq!(
        named,
        ["model-key", "other-token", "other-token"],
        "{rows:#}"
    );
    for row in &refused {
        assert_eq!(row["reason"], "secret_exfiltration", "{row}");
        assert_eq!(row["host"], "tool srv__create", "the destination: {row}");
        assert_eq!(row["correlation"], run_id.as_str(), "{row}");
    }
    outputs.push(events);
    outputs.push(audit);
    outputs.push(runwarden(&sandbox, &["events", &run_id]).await.ok());
    outputs.push(runwarden(&sandbox, &["audit", "list"]).await.ok());
    outputs.push(
        runwarden(&sandbox, &["--json", "status", &run_id])
            .await
            .ok(),
    );
    for out in &outputs {
        let all = out.all();
        assert!(
            !leaked(&all, MODEL_KEY) && !leaked(&all, OTHER_TOKEN),
            "{out:#?}"
        );
    }
    // Nor in the database or its WAL.
    for entry in std::fs::read_dir(sandbox.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        assert!(
            !leaked(&text, MODEL_KEY) && !leaked(&text, OTHER_TOKEN),
            "{} holds a secret's value",
            path.display()
        );
    }
}
