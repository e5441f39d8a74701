//! The MCP gateway as other agents meet it: the official Python and TypeScript SDKs'
//! clients (`tests/peer/gateway_client.py`, `gateway_client.mjs`, the same scenarios and
//! findings) against `runwarden serve` at `/mcp`, with the real Python peer
//! (`tests/peer/server.py`) behind it, whose own counters say what reached it. A session
//! is a run; its calls go through the policies, approvals and the fence; a client's cancel
//! and an operator's cancel both reach the upstream handler. Each scenario runs once per
//! SDK (`...::python`, `...::typescript`).

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::Peer;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::support::serve::{Api, Serve, named_token};
use crate::support::workers::{events, status};
use crate::support::{Sandbox, runwarden};

/// How long a test waits for an event before failing.
const WAIT: Duration = Duration::from_secs(30);

const POLICIES: &str = r#"
@id("tools")
permit (principal, action == Action::"call_tool", resource);

@id("no-payments-to-mallory")
@reason("the IDE does not pay mallory")
forbid (principal in Token::"ide", action == Action::"call_tool", resource == Tool::"peer__pay")
when { context.arguments.to == "mallory" };

@id("nothing-big-from-the-ide")
forbid (principal in Token::"ide", action == Action::"call_tool", resource == Tool::"peer__big");
"#;

/// An installation with the peer imported as `peer` (`add` and `echo` read-only,
/// `create_ticket` needing an approval), the policies above, the gateway open to token
/// `ide` (every tool), `narrow` (only `peer__add`) and `watcher` (a viewer), and `serve`
/// running. Returns the sandbox, the server and the `ide` token.
async fn install(peer: &Peer) -> (Arc<Sandbox>, Serve, String) {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        r#"
[policy]
files = ["policies/*.cedar"]

[mcp.servers.peer]
url = "{}"
elicitation = "operator"
sampling = "client"
# A question inside a call's stream is the 2025-11-25 way.
protocol = "2025-11-25"

[mcp.servers.peer.tools.add]
effect = "read_only"

[mcp.servers.peer.tools.echo]
effect = "read_only"

[mcp.servers.peer.tools.create_ticket]
approval = "required"

[gateway.tokens.ide]
tools = ["peer__*"]

[gateway.tokens.narrow]
tools = ["peer__add"]

[gateway.tokens.watcher]
tools = ["peer__*"]
"#,
        peer.url()
    ));
    std::fs::create_dir(sandbox.path().join("policies")).unwrap();
    std::fs::write(sandbox.path().join("policies/gateway.cedar"), POLICIES).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    let token = named_token(&sandbox, "operator", "ide").await;
    let serve = Serve::start(&sandbox, 1).await;
    (sandbox, serve, token)
}

/// Whose client runs the scenario.
#[derive(Debug, Clone, Copy)]
enum Sdk {
    Python,
    TypeScript,
}

impl Sdk {
    /// The command that runs this SDK's scenario script.
    fn command(self) -> tokio::process::Command {
        match self {
            Self::Python => runwarden_testkit::peer_command("gateway_client.py").into(),
            Self::TypeScript => {
                let dir = runwarden_testkit::required_path(
                    "RUNWARDEN_CONFORMANCE_DIR",
                    "Node and the TypeScript SDK (installed with the conformance suite)",
                    "scripts/conformance.sh",
                );
                let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../tests/peer/gateway_client.mjs");
                let mut command = tokio::process::Command::new(dir.join("node/bin/node"));
                command.arg(script).env(
                    "MCP_TS_SDK",
                    dir.join("everything/node_modules/@modelcontextprotocol/sdk"),
                );
                command
            }
        }
    }
}

/// Runs `$scenario(sdk)` as one test per SDK.
macro_rules! for_each_sdk {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn python() {
                super::$scenario(super::Sdk::Python).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn typescript() {
                super::$scenario(super::Sdk::TypeScript).await;
            }
        }
    )*};
}

for_each_sdk!(
    a_client_lists_and_calls_tools_and_its_session_is_a_run,
    a_token_sees_only_its_tools_and_one_not_listed_cannot_start,
    the_servers_progress_reaches_the_client,
    a_clients_cancel_reaches_the_upstream_handler_and_the_write_stays_fenced,
    an_operators_cancel_reaches_the_upstream_handler_and_the_client,
    an_operators_cancel_of_one_call_reaches_its_handler_and_the_session_goes_on,
    a_client_that_goes_away_mid_call_stops_the_upstream_call,
    a_servers_question_goes_to_the_client_that_can_answer_it,
    a_servers_sampling_request_goes_to_the_client_that_samples,
    an_approval_gated_write_waits_for_a_person_and_runs_once,
    a_call_a_policy_denies_never_reaches_the_upstream_server,
);

/// An SDK's client running one scenario of its script.
struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Client {
    fn start(sdk: Sdk, serve: &Serve, token: &str, args: &[&str]) -> Self {
        let mut command = sdk.command();
        command
            .arg(format!("{}/mcp", serve.url()))
            .args(args)
            .env("GATEWAY_TOKEN", token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("the client starts");
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The client's next finding.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("the client's next finding in time")
            .expect("the client's stdout reads")
            .expect("the client printed another finding before it exited");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Every finding left, once the client exits.
    async fn rest(mut self) -> Vec<Value> {
        let mut found = Vec::new();
        while let Ok(Some(line)) = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("the client ends in time")
        {
            found.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
        }
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the client exits in time")
            .expect("the client is waited for");
        assert!(status.success(), "the client failed: {status}");
        found
    }

    /// Tells a waiting scenario to go on (`cancel`).
    async fn go_on(&mut self) {
        self.stdin.write_all(b"go\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }
}

/// One scenario run to its end.
async fn scenario(sdk: Sdk, serve: &Serve, token: &str, args: &[&str]) -> Vec<Value> {
    Client::start(sdk, serve, token, args).rest().await
}

/// The finding about `tool`'s call.
fn call_of<'f>(found: &'f [Value], tool: &str) -> &'f Value {
    found
        .iter()
        .find(|f| f["tool"] == tool)
        .unwrap_or_else(|| panic!("no call of {tool}: {found:#?}"))
}

/// Polls `probe` every 20 ms until it finds what it looks for, at most [`WAIT`].
async fn until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The client running `scenario` (`wait` or `cancel`), once its `peer__slow` call has
/// reached the peer.
async fn slow_call_open(
    sdk: Sdk,
    (serve, token): (&Serve, &str),
    peer: &Peer,
    scenario: &str,
) -> Client {
    let mut client = Client::start(sdk, serve, token, &[scenario]);
    client.next().await;
    assert_eq!(client.next().await["calling"], "peer__slow");
    until_peer(peer, |s| s["slow_started"] == 1).await;
    client
}

/// Waits until the peer's counters satisfy `ready`.
async fn until_peer(peer: &Peer, ready: impl Fn(&Value) -> bool) -> Value {
    until("the peer's counters", || {
        let stats = peer.stats_json();
        std::future::ready(ready(&stats).then_some(stats))
    })
    .await
}

/// The gateway runs, newest first.
async fn gateway_runs(sandbox: &Arc<Sandbox>) -> Vec<Value> {
    let listed = runwarden(sandbox, &["--json", "runs", "list"])
        .await
        .ok()
        .json();
    listed
        .as_array()
        .expect("a list of runs")
        .iter()
        .filter(|r| r["agent"] == "gateway")
        .cloned()
        .collect()
}

/// Waits until the newest gateway run has `status`.
async fn until_run(sandbox: &Arc<Sandbox>, status: &str) -> Value {
    until(&format!("a gateway run {status}"), || async {
        let runs = gateway_runs(sandbox).await;
        runs.into_iter().next().filter(|r| r["status"] == status)
    })
    .await
}

async fn a_client_lists_and_calls_tools_and_its_session_is_a_run(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let found = scenario(sdk, &serve, &token, &["list"]).await;
    assert_eq!(found[0]["server"], "runwarden", "{found:#?}");
    let tools = found[1]["tools"].as_array().expect("the tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(
        names.contains(&"peer__add") && names.contains(&"peer__create_ticket"),
        "{names:?}"
    );
    assert!(
        names.contains(&"peer__pay"),
        "a forbid on arguments hides nothing"
    );
    assert!(
        !names.contains(&"peer__big"),
        "a tool denied on every call is not shown"
    );
    let add = tools.iter().find(|t| t["name"] == "peer__add").unwrap();
    assert_eq!(
        add["annotations"]["read_only_hint"], true,
        "the effect as a hint"
    );
    let ticket = tools
        .iter()
        .find(|t| t["name"] == "peer__create_ticket")
        .unwrap();
    assert_eq!(ticket["annotations"]["idempotent_hint"], false);
    let sum = call_of(&found, "peer__add");
    assert_eq!(sum["text"], "5", "{sum}");
    assert_eq!(
        sum["structured"],
        json!({"result": 5}),
        "structured results pass through"
    );
    assert_eq!(call_of(&found, "peer__echo")["text"], "hello");

    // The session was a run of its own, started by the token, settled when it closed.
    let run = until_run(&sandbox, "completed").await;
    assert_eq!(run["started_by"], "ide", "{run:#}");
    assert_eq!(run["tags"], json!(["gateway"]));
    let run_id = run["run_id"].as_str().unwrap();
    let log = events(&sandbox, run_id).await;
    let steps: Vec<&Value> = log
        .iter()
        .filter(|e| e["kind"] == "tool_executed")
        .collect();
    assert_eq!(steps.len(), 2, "{log:#?}");
    assert_eq!(steps[0]["payload"]["tool"], "peer__add");
    assert_eq!(steps[0]["payload"]["server"], "peer");
    runwarden(&sandbox, &["audit", "verify"]).await.ok();
    assert_eq!(peer.stats_json()["calls"]["add"], 1);
}

async fn a_token_sees_only_its_tools_and_one_not_listed_cannot_start(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, _) = install(&peer).await;
    let narrow = named_token(&sandbox, "operator", "narrow").await;
    let found = scenario(sdk, &serve, &narrow, &["list"]).await;
    let names: Vec<&str> = found[1]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["peer__add"], "only its own tools");
    let echo = call_of(&found, "peer__echo");
    assert_eq!(echo["is_error"], true, "{echo}");
    assert!(
        echo["text"].as_str().unwrap().contains("no tool named"),
        "{echo}"
    );
    assert_eq!(
        peer.stats_json()["calls"]["echo"],
        Value::Null,
        "nothing reached the peer"
    );

    let stranger = named_token(&sandbox, "operator", "stranger").await;
    let found = scenario(sdk, &serve, &stranger, &["list"]).await;
    let refused = found.last().unwrap();
    let said = refused["session_error"].as_str().unwrap_or_default();
    assert!(said.contains("[gateway.tokens.stranger]"), "{found:#?}");

    let viewer = named_token(&sandbox, "viewer", "watcher").await;
    let found = scenario(sdk, &serve, &viewer, &["list"]).await;
    let add = call_of(&found, "peer__add");
    assert!(
        add["error"].as_str().unwrap().contains("operator role"),
        "{add}"
    );
    assert_eq!(
        peer.stats_json()["calls"]["add"],
        1,
        "only the narrow token's call"
    );
}

async fn the_servers_progress_reaches_the_client(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (_sandbox, serve, token) = install(&peer).await;
    let found = scenario(sdk, &serve, &token, &["progress"]).await;
    assert_eq!(
        call_of(&found, "peer__progress")["text"],
        "done after 3 steps"
    );
    let progress = found.last().unwrap()["progress"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(progress.len(), 3, "{progress:#?}");
    assert_eq!(progress[2]["message"], "step 3 of 3");
    assert_eq!(progress[2]["total"], 3.0);
}

async fn a_clients_cancel_reaches_the_upstream_handler_and_the_write_stays_fenced(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let mut client = slow_call_open(sdk, (&serve, &token), &peer, "cancel").await;
    client.go_on().await;
    let stats = until_peer(&peer, |s| s["slow_cancelled"] == 1).await;
    assert_eq!(
        stats["slow_completed"], 0,
        "the handler was cancelled: {stats}"
    );
    let found = client.rest().await;
    assert!(
        found.iter().any(|f| f["cancelled"] == "peer__slow"),
        "{found:#?}"
    );
    assert_eq!(
        call_of(&found, "peer__add")["text"],
        "42",
        "the session goes on"
    );
    // `slow` is a non-idempotent write (the default) that may have run: its step says
    // so, the fence stays, and the run ends saying why.
    let run = until_run(&sandbox, "failed").await;
    assert!(
        run["termination_reason"]
            .as_str()
            .unwrap()
            .starts_with("FENCED_WRITE"),
        "{run:#}"
    );
    assert_eq!(run["pending_effect"], "non_idempotent_write");
    let log = events(&sandbox, run["run_id"].as_str().unwrap()).await;
    assert!(
        log.iter().any(|e| e["kind"] == "effect_uncertain"),
        "{log:#?}"
    );
    assert_eq!(peer.stats_json()["calls"]["slow"], 1, "never sent again");
}

async fn an_operators_cancel_reaches_the_upstream_handler_and_the_client(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let mut client = slow_call_open(sdk, (&serve, &token), &peer, "wait").await;
    let run = until_run(&sandbox, "running").await;
    let run_id = run["run_id"].as_str().unwrap();
    runwarden(&sandbox, &["cancel", run_id]).await.ok();
    let answer = client.next().await;
    assert_eq!(answer["error_code"], -32800, "{answer}");
    let said = answer["error"].as_str().unwrap();
    assert!(said.contains("cancelled by an operator"), "{said}");
    assert!(
        said.contains("outcome is unknown"),
        "a write is never called safe: {said}"
    );
    until_peer(&peer, |s| s["slow_cancelled"] == 1).await;
    let after = client.rest().await;
    assert!(
        call_of(&after, "peer__add")["error"]
            .as_str()
            .unwrap()
            .contains("no such session"),
        "{after:#?}"
    );
    assert_eq!(status(&sandbox, run_id).await["status"], "cancelled");
    assert_eq!(peer.stats_json()["calls"]["add"], Value::Null);
}

async fn an_operators_cancel_of_one_call_reaches_its_handler_and_the_session_goes_on(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let mut client = slow_call_open(sdk, (&serve, &token), &peer, "wait").await;
    let run = until_run(&sandbox, "running").await;
    let run_id = run["run_id"].as_str().unwrap().to_string();
    // The open call, as the server holding the session lists it, then its cancel.
    let http = reqwest::Client::new();
    let listed = Api::new(&serve)
        .get(&format!("/v1/runs/{run_id}/calls"), &token)
        .await;
    assert_eq!(listed["calls"][0]["tool"], "peer__slow", "{listed}");
    let call_id = listed["calls"][0]["call_id"].as_str().unwrap();
    let cancelled = http
        .post(format!(
            "{}/v1/runs/{run_id}/calls/{call_id}/cancel",
            serve.url()
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status().as_u16(), 200);
    let answer = client.next().await;
    assert_eq!(answer["error_code"], -32800, "{answer}");
    let said = answer["error"].as_str().unwrap();
    assert!(said.contains("cancelled by an operator"), "{said}");
    assert!(said.contains("outcome is unknown"), "{said}");
    until_peer(&peer, |s| s["slow_cancelled"] == 1).await;
    // The session goes on: the next call of the scenario is answered.
    let after = client.rest().await;
    assert_eq!(call_of(&after, "peer__add")["text"], "2", "{after:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_client_discovers_lists_and_calls_and_each_call_is_a_run() {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let mut command = Sdk::Python.command();
    command
        .arg(format!("{}/mcp", serve.url()))
        .arg("list")
        .env("GATEWAY_TOKEN", &token)
        .env("GATEWAY_MODE", "auto")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let output = tokio::time::timeout(WAIT, command.output())
        .await
        .unwrap()
        .unwrap();
    let found: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(found.len() > 1, "{found:#?} {stderr}");
    assert_eq!(found[0]["version"], "2026-07-28", "{found:#?}");
    assert!(
        found[1]["tools"].as_array().unwrap().len() > 2,
        "{found:#?}"
    );
    assert_eq!(call_of(&found, "peer__add")["text"], "5");
    assert_eq!(call_of(&found, "peer__echo")["text"], "hello");
    // No session: each call was a run of its own, settled when the call ended.
    let runs = gateway_runs(&sandbox).await;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:#?}");
    assert_eq!(peer.stats_json()["calls"]["add"], 1);
}

async fn a_servers_sampling_request_goes_to_the_client_that_samples(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (_sandbox, serve, token) = install(&peer).await;
    let found = scenario(sdk, &serve, &token, &["sample"]).await;
    let asked = call_of(&found, "peer__ask_sampling");
    assert!(
        asked["text"].as_str().unwrap().starts_with("sampled in"),
        "{found:#?}"
    );
    let sampled = found.last().unwrap()["sampled"].clone();
    assert_eq!(
        sampled,
        json!(["hi"]),
        "the client saw the server's message"
    );
    // A client that does not sample: the server hears a refusal at once.
    let found = scenario(sdk, &serve, &token, &["call", "peer__ask_sampling", "{}"]).await;
    let refused = call_of(&found, "peer__ask_sampling")["text"].clone();
    assert!(
        refused.as_str().unwrap().starts_with("refused"),
        "{found:#?}"
    );
}

async fn a_servers_question_goes_to_the_client_that_can_answer_it(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (_sandbox, serve, token) = install(&peer).await;
    let found = scenario(sdk, &serve, &token, &["ask"]).await;
    let asked = call_of(&found, "peer__ask_name");
    assert_eq!(asked["text"], "accepted: Ada", "{found:#?}");
    let questions = found.last().unwrap()["questions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(questions, [json!("What name should the ticket carry?")]);
}

async fn a_client_that_goes_away_mid_call_stops_the_upstream_call(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let mut client = slow_call_open(sdk, (&serve, &token), &peer, "wait").await;
    client.child.kill().await.unwrap();
    let stats = until_peer(&peer, |s| s["slow_cancelled"] == 1).await;
    assert_eq!(stats["slow_completed"], 0, "{stats}");
    // The write may have run: its step says so and keeps the fence; nothing re-sends it.
    let run = until_run_with_step(&sandbox, "effect_uncertain").await;
    assert_eq!(run["pending_effect"], "non_idempotent_write", "{run:#}");
    assert_eq!(peer.stats_json()["calls"]["slow"], 1);
}

/// Waits until the newest gateway run has a step of `kind`; the run as listed then.
async fn until_run_with_step(sandbox: &Arc<Sandbox>, kind: &str) -> Value {
    until(&format!("a {kind} step"), || async {
        let run = gateway_runs(sandbox).await.into_iter().next()?;
        let log = events(sandbox, run["run_id"].as_str()?).await;
        log.iter().any(|e| e["kind"] == kind).then_some(run)
    })
    .await
}

async fn an_approval_gated_write_waits_for_a_person_and_runs_once(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (sandbox, serve, token) = install(&peer).await;
    let arguments = json!({"title": "printer on fire"}).to_string();
    for (answer, expected) in [
        (&["approve"][..], Some("ticket-1")),
        (&["deny", "--reason", "not today"], None),
    ] {
        let client = Client::start(
            sdk,
            &serve,
            &token,
            &["call", "peer__create_ticket", &arguments],
        );
        let decision = pending_decision(&sandbox).await;
        assert_eq!(decision["waits_in_call"], true, "{decision:#}");
        assert_eq!(decision["tool"], "peer__create_ticket");
        let before = u64::from(answer[0] == "deny");
        assert_eq!(
            peer.stats_json()["create_ticket_calls"],
            before,
            "nothing sent yet"
        );
        let id = decision["decision_id"].as_str().unwrap();
        runwarden(&sandbox, &[answer, &[id]].concat())
            .await
            .ok()
            .says("goes on with its call");
        let found = client.rest().await;
        let ticket = call_of(&found, "peer__create_ticket");
        match expected {
            Some(text) => assert_eq!(ticket["text"], text, "{ticket}"),
            None => {
                assert_eq!(ticket["is_error"], true, "{ticket}");
                let text = ticket["text"].as_str().unwrap();
                assert!(text.contains("denied by an operator: not today"), "{text}");
            }
        }
    }
    assert_eq!(
        peer.stats_json()["create_ticket_calls"],
        1,
        "approved once, denied never sent"
    );
}

/// Waits for the one pending decision.
async fn pending_decision(sandbox: &Arc<Sandbox>) -> Value {
    until("a pending decision", || async {
        let args = ["--json", "decisions", "list", "--status", "pending"];
        let listed = runwarden(sandbox, &args).await.ok().json();
        listed["decisions"].as_array()?.first().cloned()
    })
    .await
}

async fn a_call_a_policy_denies_never_reaches_the_upstream_server(sdk: Sdk) {
    let peer = Peer::start(&[]);
    let (_sandbox, serve, token) = install(&peer).await;
    let arguments = json!({"amount": 5, "to": "mallory"}).to_string();
    let found = scenario(sdk, &serve, &token, &["call", "peer__pay", &arguments]).await;
    let paid = call_of(&found, "peer__pay");
    assert_eq!(paid["is_error"], true, "{paid}");
    assert!(
        paid["text"]
            .as_str()
            .unwrap()
            .contains("the IDE does not pay mallory"),
        "{paid}"
    );
    assert_eq!(
        peer.stats_json()["calls"]["pay"],
        Value::Null,
        "nothing reached the peer"
    );
}
