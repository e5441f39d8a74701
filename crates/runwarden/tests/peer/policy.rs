//! Cedar policy over every tool call as operators meet it: the real binary and the real
//! Python MCP peer (`tests/peer/server.py`), whose own per-tool counters say whether a call
//! reached it. A denied call never reaches the peer and its audit row names the policy; a
//! rule on an argument, an approval above an amount, one agent denied where another is
//! allowed, and an argument's value kept out of everything the policy step writes.

use std::sync::Arc;

use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::Live as Child;
use crate::support::workers::{config_with_short_leases, enqueue, events};
use crate::support::{Sandbox, runwarden};

const POLICIES: &str = r#"
@id("models")
permit (principal, action == Action::"call_model", resource);

@id("peer-tools")
permit (principal, action == Action::"call_tool", resource)
when { resource.server == "peer" };

@id("no-write-outside-srv")
@reason("writes stay under /srv")
forbid (principal, action == Action::"call_tool", resource == Tool::"peer__write_file")
unless { context.arguments has path && context.arguments.path like "/srv/*" };

@id("big-payments")
@approval("required")
@reason("payments above 1000 need a person")
permit (principal, action == Action::"call_tool", resource == Tool::"peer__pay")
when { context.arguments.amount > 1000 };

@id("no-pay-to-mallory")
forbid (principal, action == Action::"call_tool", resource == Tool::"peer__pay")
when { context.arguments.to == "mallory" };

@id("not-for-mallory")
@reason("runs mallory starts call nothing")
forbid (principal in Token::"mallory", action == Action::"call_tool", resource);

@id("no-intern-tickets")
@reason("interns do not file tickets")
forbid (principal == Agent::"intern", action, resource == Tool::"peer__create_ticket");

@id("echo-is-short")
forbid (principal, action, resource == Tool::"peer__echo")
when { context.arguments.text > 5 };
"#;

/// How often the peer ran `tool`, by its own count.
fn calls(peer: &Peer, tool: &str) -> u64 {
    let stats: Value = serde_json::from_str(&peer.stats()).expect("the peer's stats are JSON");
    stats["calls"][tool].as_u64().unwrap_or(0)
}

/// An installation with the peer imported as `peer`, the policies above, and one agent per
/// `(name, plan)`, each offered every tool of the peer.
async fn install(peer: &Peer, agents: &[(&str, Value)]) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = config_with_short_leases(&sandbox);
    text.push_str(&format!(
        "\n[policy]\nfiles = [\"policies/*.cedar\"]\n\n[mcp.servers.peer]\nurl = \"{}\"\n",
        peer.url()
    ));
    for (name, plan) in agents {
        text.push_str(&format!(
            "\n[agents.{name}]\nprovider = \"scripted\"\nscript = \"{name}.json\"\ntools = [\"peer__*\"]\n"
        ));
        std::fs::write(
            sandbox.path().join(format!("{name}.json")),
            plan.to_string(),
        )
        .unwrap();
    }
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::create_dir(sandbox.path().join("policies")).unwrap();
    std::fs::write(sandbox.path().join("policies/peer.cedar"), POLICIES).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    sandbox
}

fn one_call(tool: &str, arguments: Value) -> Value {
    json!([
        {"tool_calls": [{"name": tool, "arguments": arguments}]},
        {"text": "done"}
    ])
}

/// Runs `agent` to its end (or its park) on `worker`; its outcome and its log.
async fn run(
    sandbox: &Arc<Sandbox>,
    worker: &mut Child,
    agent: &str,
) -> (String, Value, Vec<Value>) {
    let run_id = enqueue(sandbox, agent, "go").await;
    let (outcome, _) = worker.outcome_of(&run_id).await;
    let log = events(sandbox, &run_id).await;
    (run_id, outcome, log)
}

/// The run's `tool_executed` payloads.
fn steps(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|e| e["kind"] == "tool_executed")
        .map(|e| e["payload"].clone())
        .collect()
}

/// Every audit row, as `audit list --json` prints them.
async fn audit_rows(sandbox: &Arc<Sandbox>) -> Vec<Value> {
    let out = runwarden(sandbox, &["--json", "audit", "list", "--limit", "1000"])
        .await
        .ok();
    let value = out.json();
    match value {
        Value::Array(rows) => rows,
        other => other["rows"].as_array().cloned().unwrap_or_default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_write_never_reaches_the_peer_and_its_audit_row_names_the_policy() {
    let peer = Peer::start(&[]);
    let sandbox = install(
        &peer,
        &[
            (
                "outside",
                one_call(
                    "peer__write_file",
                    json!({"path": "/etc/passwd", "content": "x"}),
                ),
            ),
            (
                "inside",
                one_call(
                    "peer__write_file",
                    json!({"path": "/srv/a.txt", "content": "x"}),
                ),
            ),
        ],
    )
    .await;
    let mut worker = Child::worker(&sandbox, None);

    let (run_id, outcome, log) = run(&sandbox, &mut worker, "outside").await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(
        calls(&peer, "write_file"),
        0,
        "a denied call never reaches the server"
    );
    let step = &steps(&log)[0];
    assert_eq!(step["outcome"], "denied");
    assert_eq!(step["sent"], false);
    assert_eq!(
        step["text"],
        "denied by policy no-write-outside-srv: writes stay under /srv"
    );
    assert_eq!(
        step["policy"],
        json!({"decision": "deny", "policies": ["no-write-outside-srv"], "reasons": ["writes stay under /srv"]})
    );
    let rows: Vec<Value> = audit_rows(&sandbox)
        .await
        .into_iter()
        .filter(|r| r["action"] == "policy_decided")
        .collect();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["correlation"], run_id.as_str());
    let reason = rows[0]["reason"].as_str().unwrap();
    assert!(reason.contains("no-write-outside-srv"), "{reason}");
    assert!(
        !reason.contains("/etc/passwd"),
        "no argument value: {reason}"
    );
    runwarden(&sandbox, &["audit", "verify"]).await.ok();

    let (_, outcome, log) = run(&sandbox, &mut worker, "inside").await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(
        calls(&peer, "write_file"),
        1,
        "an allowed write is sent once"
    );
    let step = &steps(&log)[0];
    assert_eq!(step["outcome"], "succeeded");
    assert_eq!(step["policy"]["decision"], "allow");
    assert_eq!(step["policy"]["policies"], json!(["peer-tools"]));
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_above_the_limit_waits_for_an_operator_told_which_policy_asked() {
    let peer = Peer::start(&[]);
    let sandbox = install(
        &peer,
        &[
            (
                "big",
                one_call("peer__pay", json!({"amount": 5000, "to": "acme"})),
            ),
            (
                "small",
                one_call("peer__pay", json!({"amount": 20, "to": "acme"})),
            ),
        ],
    )
    .await;
    let mut worker = Child::worker(&sandbox, None);

    let (_, outcome, _) = run(&sandbox, &mut worker, "small").await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(calls(&peer, "pay"), 1, "a small payment needs nobody");

    let (run_id, outcome, _) = run(&sandbox, &mut worker, "big").await;
    assert_eq!(outcome["outcome"], "waiting_for_approval", "{outcome:#}");
    assert_eq!(
        calls(&peer, "pay"),
        1,
        "nothing is sent before the approval"
    );
    let listed = runwarden(&sandbox, &["--json", "decisions", "list", "--run", &run_id])
        .await
        .ok()
        .json();
    let decision = &listed["decisions"][0];
    let message = decision["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("big-payments") && message.contains("payments above 1000 need a person"),
        "{listed:#}"
    );
    let approval_rows = audit_rows(&sandbox)
        .await
        .into_iter()
        .filter(|r| r["action"] == "policy_decided")
        .count();
    assert_eq!(approval_rows, 1);

    let id = decision["decision_id"].as_str().unwrap();
    runwarden(&sandbox, &["approve", id]).await.ok();
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(calls(&peer, "pay"), 2, "approved, the payment is sent once");
    let step = &steps(&events(&sandbox, &run_id).await)[0];
    assert_eq!(step["policy"]["decision"], "approval_required");
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_s_edit_is_decided_again_and_a_forbid_still_wins() {
    let peer = Peer::start(&[]);
    let plan = one_call("peer__pay", json!({"amount": 5000, "to": "acme"}));
    let sandbox = install(&peer, &[("big", plan)]).await;
    let mut worker = Child::worker(&sandbox, None);
    let (run_id, outcome, _) = run(&sandbox, &mut worker, "big").await;
    assert_eq!(outcome["outcome"], "waiting_for_approval", "{outcome:#}");
    let listed = runwarden(&sandbox, &["--json", "decisions", "list", "--run", &run_id])
        .await
        .ok()
        .json();
    let id = listed["decisions"][0]["decision_id"]
        .as_str()
        .unwrap()
        .to_string();
    let edited = json!({"amount": 5000, "to": "mallory"}).to_string();
    runwarden(&sandbox, &["approve", &id, "--arguments", &edited])
        .await
        .ok();
    let (outcome, _) = worker.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(
        calls(&peer, "pay"),
        0,
        "the edit is forbidden: nothing is paid"
    );
    let step = &steps(&events(&sandbox, &run_id).await)[0];
    assert_eq!(step["outcome"], "denied");
    assert_eq!(step["policy"]["policies"], json!(["no-pay-to-mallory"]));
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_is_denied_a_tool_another_may_call() {
    let peer = Peer::start(&[]);
    let plan = one_call("peer__create_ticket", json!({"title": "printer"}));
    let sandbox = install(&peer, &[("intern", plan.clone()), ("senior", plan)]).await;
    let mut worker = Child::worker(&sandbox, None);

    let (_, outcome, log) = run(&sandbox, &mut worker, "intern").await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(calls(&peer, "create_ticket"), 0);
    assert_eq!(
        steps(&log)[0]["policy"]["policies"],
        json!(["no-intern-tickets"])
    );

    let (_, outcome, _) = run(&sandbox, &mut worker, "senior").await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(calls(&peer, "create_ticket"), 1);
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_value_stays_out_of_the_denial_its_step_and_its_audit_row() {
    const SIGIL: &str = "sigil-policy-7f3a9c";
    let peer = Peer::start(&[]);
    // `text > 5` fails on a string: a forbid that fails denies, in Cedar's words.
    let sandbox = install(
        &peer,
        &[("a", one_call("peer__echo", json!({"text": SIGIL})))],
    )
    .await;
    let mut worker = Child::worker(&sandbox, None);
    let (_, outcome, log) = run(&sandbox, &mut worker, "a").await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(calls(&peer, "echo"), 0);
    let step = &steps(&log)[0];
    let text = step["text"].as_str().unwrap();
    assert!(
        text.starts_with("denied by policy echo-is-short: policy echo-is-short failed: type error"),
        "{text}"
    );
    assert!(!step.to_string().contains(SIGIL), "{step}");
    let rows = audit_rows(&sandbox).await;
    assert!(
        rows.iter().any(|r| r["action"] == "policy_decided"),
        "{rows:#?}"
    );
    assert!(!Value::Array(rows).to_string().contains(SIGIL));
    // The model's own turn holds the arguments it wrote; no other event does.
    for event in log.iter().filter(|e| e["kind"] != "model_response") {
        assert!(!event.to_string().contains(SIGIL), "{event}");
    }
    worker.stop_idle().await;
}

/// `POST /v1/runs` for `agent` with `token`: the run's id.
async fn enqueue_as(url: &str, token: &str, agent: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{url}/v1/runs"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(json!({"agent": agent, "prompt": "go"}).to_string())
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status().as_u16(), 202);
    let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    body["run_id"]
        .as_str()
        .or(body["id"].as_str())
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_that_started_a_run_is_its_agents_parent() {
    let peer = Peer::start(&[]);
    let plan = one_call("peer__create_ticket", json!({"title": "printer"}));
    let sandbox = install(&peer, &[("senior", plan)]).await;
    let mut tokens = Vec::new();
    for name in ["mallory", "alice"] {
        let created = runwarden(
            &sandbox,
            &[
                "--json", "token", "create", "--role", "operator", "--name", name,
            ],
        )
        .await
        .ok()
        .json();
        tokens.push(created["token"].as_str().unwrap().to_string());
    }
    let mut serve = Child::spawn(sandbox.command(&[
        "--json",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--concurrency",
        "0",
    ]));
    let url = serve.json().await["url"].as_str().unwrap().to_string();
    let by_mallory = enqueue_as(&url, &tokens[0], "senior").await;
    let by_alice = enqueue_as(&url, &tokens[1], "senior").await;

    let mut worker = Child::worker(&sandbox, None);
    let mut ended = Vec::new();
    while ended.len() < 2 {
        let line = worker.json().await;
        if line["run_id"] == by_mallory.as_str() || line["run_id"] == by_alice.as_str() {
            assert_eq!(line["outcome"], "completed", "{line:#}");
            ended.push(line);
        }
    }
    assert_eq!(
        calls(&peer, "create_ticket"),
        1,
        "only alice's run files its ticket"
    );
    let denied = &steps(&events(&sandbox, &by_mallory).await)[0];
    assert_eq!(denied["policy"]["policies"], json!(["not-for-mallory"]));
    let allowed = &steps(&events(&sandbox, &by_alice).await)[0];
    assert_eq!(allowed["policy"]["decision"], "allow");
    worker.stop_idle().await;
    serve.signal("TERM");
}
