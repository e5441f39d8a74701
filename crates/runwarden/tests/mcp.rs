//! `runwarden mcp`: import, list, call and health against MCP servers on 127.0.0.1, and
//! Ctrl-C (SIGINT) cancelling a call in flight.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpReply, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::{SIGIL, Sandbox, runwarden};

const WAIT: Duration = Duration::from_secs(10);

/// An initialised sandbox that allows loopback and declares `srv` at `url`.
fn sandbox_with_server(url: &str, extra: &str) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!("\n[mcp.servers.srv]\nurl = \"{url}\"\n{extra}\n[mcp.servers.srv.tools.search]\neffect = \"read_only\"\n"));
    std::fs::write(sandbox.config(), text).unwrap();
    Arc::new(sandbox)
}

fn tools() -> Vec<Value> {
    let refused = json!({"name": "recursive", "inputSchema": {"type": "object",
        "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
        "properties": {"head": {"$ref": "#/$defs/n"}}}});
    vec![tool("search"), tool("create.ticket"), refused, tool("slow")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_stores_local_names_effects_and_refusals_and_list_shows_them() {
    let server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .ok()
        .says("imported 4 tools from srv (1 refused)")
        .says("srv__create_ticket")
        .says("the schema is recursive");

    let listed = runwarden(&sandbox, &["--json", "mcp", "list"])
        .await
        .ok()
        .json();
    let tools = listed[0]["tools"].as_array().unwrap();
    let search = tools
        .iter()
        .find(|t| t["local_name"] == "srv__search")
        .unwrap();
    assert_eq!(search["effect"], "read_only", "the operator's declaration");
    let create = tools
        .iter()
        .find(|t| t["local_name"] == "srv__create_ticket")
        .unwrap();
    assert_eq!(
        (create["remote_name"].as_str(), create["effect"].as_str()),
        (Some("create.ticket"), Some("non_idempotent_write"))
    );
    let recursive = tools
        .iter()
        .find(|t| t["local_name"] == "srv__recursive")
        .unwrap();
    assert_eq!(recursive["usable"], false);
    assert!(
        listed[0]["last_success"].is_string(),
        "the import was recorded as a successful contact"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn importing_a_server_without_tools_says_so_and_succeeds_with_nothing_imported() {
    // A server that only offers prompts: its initialize result has no tools capability.
    let mut server = TestServer::start(|request| {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        if body["method"].as_str().unwrap_or_default().starts_with("notifications/") {
            return HttpReply::Respond { status: 202, headers: vec![], body: vec![] };
        }
        let result = json!({"protocolVersion": "2025-11-25", "capabilities": {"prompts": {}}, "serverInfo": {"name": "prompts-only", "version": "1"}});
        HttpReply::typed(200, "application/json", json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string())
    })
    .await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    let imported = runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .ok()
        .says("server srv offers no tools")
        .says("nothing imported");
    assert!(!imported.all().contains("error"), "{}", imported.all());
    let report = runwarden(&sandbox, &["--json", "mcp", "import", "srv"])
        .await
        .ok()
        .json();
    assert_eq!(
        (
            report["imported"].as_u64(),
            report["offers_tools"].as_bool()
        ),
        (Some(0), Some(false))
    );
    let methods: Vec<String> = server
        .drain_requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter_map(|m| m["method"].as_str().map(str::to_string))
        .collect();
    assert!(!methods.iter().any(|m| m == "tools/list"), "{methods:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_by_local_name_puts_the_remote_name_on_the_wire() {
    let mut server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    runwarden(
        &sandbox,
        &[
            "mcp",
            "call",
            "srv",
            "srv__create_ticket",
            "--args",
            r#"{"q":"printer"}"#,
        ],
    )
    .await
    .ok()
    .says("create.ticket {\"q\":\"printer\"}")
    .says("succeeded");
    let wire: Vec<Value> = server
        .drain_requests()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert!(
        wire.iter()
            .any(|m| m["method"] == "tools/call" && m["params"]["name"] == "create.ticket")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_refused_before_anything_is_sent() {
    let server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    runwarden(
        &sandbox,
        &["mcp", "call", "srv", "search", "--args", "[1,2]"],
    )
    .await
    .fails()
    .says("must be a JSON object");
    runwarden(&sandbox, &["mcp", "call", "nope", "search"])
        .await
        .fails()
        .says("no MCP server named \"nope\"");
    assert_eq!(server.connection_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_secret_is_missing_is_never_tried_anonymously() {
    let server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(
        &server.url("/mcp"),
        "auth = { secret = \"srv-token\", placement = \"bearer\" }",
    );
    let failed = runwarden(&sandbox, &["mcp", "import", "srv"])
        .await
        .fails()
        .says("no secret named \"srv-token\"");
    // One line per error, each thing said once.
    assert_eq!(
        failed.all().matches("no secret named").count(),
        1,
        "{}",
        failed.all()
    );
    assert_eq!(failed.all().trim().lines().count(), 1, "{}", failed.all());
    assert_eq!(
        server.connection_count(),
        0,
        "nothing was sent without the credential"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_secret_goes_on_every_leg_and_never_into_output() {
    let mut server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(
        &server.url("/mcp"),
        "auth = { secret = \"srv-token\", placement = \"bearer\" }",
    );
    sandbox.put("srv-token", SIGIL);
    let out = runwarden(
        &sandbox,
        &[
            "--json",
            "mcp",
            "call",
            "srv",
            "search",
            "--args",
            r#"{"q":"x"}"#,
        ],
    )
    .await
    .ok();
    assert!(!out.stdout.contains(SIGIL) && !out.stderr.contains(SIGIL));
    let legs = server.drain_requests();
    // The server/discover probe (this server does not serve 2026-07-28), then
    // initialize, notifications/initialized, tools/list (the server was never imported:
    // the call is checked against its tools listed live) and tools/call.
    assert_eq!(legs.len(), 5);
    for leg in legs {
        assert_eq!(
            leg.header("authorization"),
            Some(format!("Bearer {SIGIL}").as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_a_down_server_and_exits_non_zero() {
    let up = TestServer::start(mcp_handler(tools(), &[])).await;
    let down = TestServer::start(|_| HttpReply::text(503, "maintenance")).await;
    let sandbox = sandbox_with_server(&up.url("/mcp"), "");
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.down]\nurl = \"{}\"\n",
        down.url("/mcp")
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    runwarden(&sandbox, &["mcp", "health"])
        .await
        .fails()
        .says("srv: up")
        .says("down: DOWN: server down answered HTTP 503 to initialize");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cancels_a_call_in_flight_and_the_command_exits_within_a_second() {
    let mut server = TestServer::start(mcp_handler(tools(), &["slow"])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    let mut command = sandbox.command(&["mcp", "call", "srv", "slow"]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command.spawn().unwrap();
    let pid = child.id().to_string();
    // Wait until the call is on the wire (the server holds it), then press Ctrl-C.
    loop {
        let request = server.next_request(WAIT).await;
        if String::from_utf8_lossy(&request.body).contains("tools/call") {
            break;
        }
    }
    let pressed = Instant::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let output = tokio::time::timeout(
        WAIT,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .unwrap()
    .unwrap()
    .unwrap();
    let took = pressed.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the command took {took:?} to exit after SIGINT"
    );
    assert_eq!(output.status.code(), Some(130));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("cancelled by Ctrl-C"), "{stdout}");
    server.next_close(WAIT).await;

    let audit = runwarden(
        &sandbox,
        &["--json", "audit", "list", "--action", "http_call_cancelled"],
    )
    .await
    .ok()
    .json();
    assert_eq!(
        audit.as_array().unwrap().len(),
        1,
        "the audit row proves the teardown: {audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_a_tool_the_catalogue_does_not_offer_is_refused_locally_unless_forced() {
    let mut server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    let calls = |server: &mut TestServer| {
        server
            .drain_requests()
            .iter()
            .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
            .count()
    };
    assert_eq!(calls(&mut server), 0);
    runwarden(
        &sandbox,
        &["mcp", "call", "srv", "serch", "--args", r#"{"q":"x"}"#],
    )
    .await
    .fails()
    .says("server srv offers no tool \"serch\" (did you mean search?)")
    .says("nothing was sent");
    runwarden(&sandbox, &["mcp", "call", "srv", "srv__recursive"])
        .await
        .fails()
        .says("tool srv__recursive of server srv is refused by the catalogue");
    assert_eq!(calls(&mut server), 0, "the server saw no call");

    runwarden(
        &sandbox,
        &[
            "mcp",
            "call",
            "srv",
            "serch",
            "--force",
            "--args",
            r#"{"q":"x"}"#,
        ],
    )
    .await
    .ok()
    .says("serch {\"q\":\"x\"}");
    assert_eq!(calls(&mut server), 1);
    let rows = runwarden(&sandbox, &["--json", "audit", "list"])
        .await
        .ok()
        .json();
    let forced = rows.as_array().unwrap().iter().any(|r| {
        r["reason"]
            .as_str()
            .is_some_and(|t| t.contains("tools/call, forced past the catalogue"))
    });
    assert!(forced, "the forced call's rows say so: {rows}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_names_the_version_and_the_probe() {
    let server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    runwarden(&sandbox, &["mcp", "health"])
        .await
        .ok()
        .says("srv: up at protocol 2025-11-25 (ping answered in");
    let rows = runwarden(&sandbox, &["--json", "mcp", "health"])
        .await
        .ok()
        .json();
    assert_eq!(rows[0]["protocol"], "2025-11-25", "{rows}");
    assert_eq!(rows[0]["probe"], "ping", "{rows}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_too_small_to_work_and_a_limit_out_of_range_are_refused_when_the_configuration_is_read()
 {
    for (extra, says) in [
        (
            "timeout_seconds = 0.5",
            "timeout_seconds = 0.5 is too small: it is the budget of a whole operation (the handshake and the call), and must be at least 1 s",
        ),
        (
            "max_response_bytes = 10",
            "max_response_bytes = 10 is out of range: give a number of bytes from 1024 to 268435456",
        ),
    ] {
        let sandbox = sandbox_with_server("http://127.0.0.1:9/mcp", extra);
        runwarden(&sandbox, &["mcp", "list"])
            .await
            .fails()
            .says(says);
    }
}

/// A tool setting that names a tool the server does not offer would fail every run that
/// uses the server; `doctor` names it, with the tools the server does offer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_tool_setting_for_a_tool_the_server_does_not_offer() {
    let server = TestServer::start(mcp_handler(tools(), &[])).await;
    let sandbox = sandbox_with_server(&server.url("/mcp"), "");
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    let report = runwarden(&sandbox, &["--json", "doctor"]).await.json();
    let settings = |report: &Value| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "tool settings")
            .cloned()
            .unwrap_or_else(|| panic!("no tool settings check: {report:#}"))
    };
    assert_eq!(settings(&report)["verdict"], "ok", "{report:#}");

    sandbox.append_config("\n[mcp.servers.srv.tools.serch]\neffect = \"read_only\"\n");
    let out = runwarden(&sandbox, &["--json", "doctor"]).await.fails();
    let check = settings(&out.json());
    assert_eq!(check["verdict"], "problem", "{check:#}");
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"serch\"") && detail.contains("search"),
        "names the setting and what the server offers: {detail}"
    );
}
