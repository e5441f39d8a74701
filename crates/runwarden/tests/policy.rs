//! `runwarden policy validate|eval|test` as an operator runs them over real policy files,
//! a bad policy refusing the start with its file and line, and `serve` reloading the
//! policies on SIGHUP (a bad file keeps the set in force).

use serde_json::json;

use crate::support::{Live, Sandbox};

const FILES: &str = r#"
@id("read-anything")
permit (principal, action == Action::"call_tool", resource)
when { resource.effect == "read_only" };

@id("write-under-srv")
permit (principal, action == Action::"call_tool", resource == Tool::"files__write");

@id("no-write-outside-srv")
@reason("writes stay under /srv")
forbid (principal, action == Action::"call_tool", resource == Tool::"files__write")
unless { context.arguments has path && context.arguments.path like "/srv/*" };

@id("big-payments")
@approval("required")
@reason("payments above 1000 need a person")
permit (principal, action == Action::"call_tool", resource == Tool::"bank__pay")
when { context.arguments.amount > 1000 };

@id("small-payments")
permit (principal, action == Action::"call_tool", resource == Tool::"bank__pay")
when { context.arguments.amount <= 1000 };

@id("no-intern-payments")
forbid (principal == Agent::"intern", action, resource == Tool::"bank__pay");
"#;

/// An installation whose `[policy]` names `policies/*.cedar`, holding `FILES`.
fn with_policies() -> Sandbox {
    let sandbox = Sandbox::initialised();
    std::fs::create_dir(sandbox.path().join("policies")).unwrap();
    std::fs::write(sandbox.path().join("policies/tools.cedar"), FILES).unwrap();
    sandbox.append_config("\n[policy]\nfiles = [\"policies/*.cedar\"]\n");
    sandbox
}

const DEPARTMENT: &str = "@id(\"ok\")\npermit (principal, action, resource);\n\npermit (principal, action == Action::\"call_tool\", resource)\nwhen { principal.department == \"finance\" };\n";

#[test]
fn validate_counts_the_policies_of_the_configured_files() {
    let sandbox = with_policies();
    sandbox
        .run(&["policy", "validate"])
        .ok()
        .says("valid: 6 policies in 1 file");
    let out = sandbox.run(&["--json", "policy", "validate"]).ok();
    assert_eq!(out.json()["files"], json!(["policies/tools.cedar"]));
    assert_eq!(out.json()["valid"], true);
}

#[test]
fn validate_rejects_an_unknown_attribute_with_its_file_and_line() {
    let sandbox = with_policies();
    std::fs::write(sandbox.path().join("policies/hr.cedar"), DEPARTMENT).unwrap();
    sandbox
        .run(&["policy", "validate"])
        .fails()
        .says("policies/hr.cedar:5: ")
        .says("department");
    let out = sandbox.run(&["--json", "policy", "validate"]).fails();
    let problems = out.json()["problems"].clone();
    assert_eq!(problems.as_array().unwrap().len(), 1, "{problems}");
    assert!(
        problems[0]
            .as_str()
            .unwrap()
            .starts_with("policies/hr.cedar:5: ")
    );
}

#[test]
fn a_bad_policy_file_refuses_the_start_naming_its_file_and_line() {
    let sandbox = with_policies();
    std::fs::write(sandbox.path().join("policies/hr.cedar"), DEPARTMENT).unwrap();
    sandbox
        .run(&["serve", "--listen", "127.0.0.1:0"])
        .fails()
        .says("policies/hr.cedar:5: ");
}

#[test]
fn validate_reads_files_given_on_the_command_line() {
    let sandbox = Sandbox::initialised();
    std::fs::write(sandbox.path().join("a.cedar"), FILES).unwrap();
    let mut command = sandbox.command(&["policy", "validate", "--files", "*.cedar"]);
    command.current_dir(sandbox.path());
    sandbox.run_command(command).ok().says("6 policies");
    sandbox
        .run(&["policy", "validate"])
        .fails()
        .says("has no [policy] section");
}

fn eval(sandbox: &Sandbox, agent: &str, tool: &str, args: serde_json::Value) -> serde_json::Value {
    let args = args.to_string();
    sandbox
        .run(&[
            "--json", "policy", "eval", "--agent", agent, "--tool", tool, "--args", &args,
        ])
        .ok()
        .json()
}

#[test]
fn eval_prints_the_decision_its_policies_and_reasons_as_json() {
    let sandbox = with_policies();
    assert_eq!(
        eval(
            &sandbox,
            "helper",
            "files__write",
            json!({"path": "/etc/passwd"})
        ),
        json!({"decision": "deny", "policies": ["no-write-outside-srv"], "reasons": ["writes stay under /srv"]})
    );
    assert_eq!(
        eval(
            &sandbox,
            "helper",
            "files__write",
            json!({"path": "/srv/a"})
        ),
        json!({"decision": "allow", "policies": ["write-under-srv"], "reasons": []})
    );
    assert_eq!(
        eval(&sandbox, "helper", "bank__pay", json!({"amount": 5000})),
        json!({"decision": "approval_required", "policies": ["big-payments"], "reasons": ["payments above 1000 need a person"]})
    );
    assert_eq!(
        eval(&sandbox, "intern", "bank__pay", json!({"amount": 5}))["decision"],
        "deny"
    );
    assert_eq!(
        eval(&sandbox, "helper", "files__delete", json!({})),
        json!({"decision": "deny", "policies": [], "reasons": ["no policy permits this"]})
    );
}

#[test]
fn eval_for_people_names_the_decision_and_the_policy() {
    let sandbox = with_policies();
    sandbox
        .run(&[
            "policy",
            "eval",
            "--agent",
            "a",
            "--tool",
            "files__write",
            "--args",
            r#"{"path":"/etc"}"#,
        ])
        .ok()
        .says("deny\npolicies: no-write-outside-srv\nreason: writes stay under /srv");
    sandbox
        .run(&[
            "policy", "eval", "--agent", "a", "--tool", "files", "--args", "{}",
        ])
        .fails()
        .says("SERVER__TOOL");
}

const CASES: &str = r#"
[[case]]
name = "writes outside /srv are denied"
agent = "helper"
tool = "files__write"
args = { path = "/etc/passwd" }
expect = "deny"
policies = ["no-write-outside-srv"]

[[case]]
name = "big payments wait for a person"
agent = "helper"
tool = "bank__pay"
args = { amount = 5000 }
expect = "approval_required"

[[case]]
name = "interns pay nothing"
agent = "intern"
tool = "bank__pay"
args = { amount = 5 }
expect = "deny"
"#;

#[test]
fn test_prints_a_table_and_fails_on_a_wrong_expectation() {
    let sandbox = with_policies();
    let cases = sandbox.path().join("cases.toml");
    std::fs::write(&cases, CASES).unwrap();
    let cases_path = cases.display().to_string();
    sandbox
        .run(&["policy", "test", &cases_path])
        .ok()
        .says("PASS  writes outside /srv are denied: deny by no-write-outside-srv")
        .says("3 passed, 0 failed");
    std::fs::write(
        &cases,
        CASES.replace("expect = \"approval_required\"", "expect = \"allow\""),
    )
    .unwrap();
    let out = sandbox
        .run(&["policy", "test", &cases_path])
        .fails()
        .says("FAIL  big payments wait for a person: expected allow, got approval_required by big-payments")
        .says("2 passed, 1 failed");
    drop(out);
    let json = sandbox
        .run(&["--json", "policy", "test", &cases_path])
        .fails()
        .json();
    assert_eq!(
        (json["passed"].clone(), json["failed"].clone()),
        (json!(2), json!(1))
    );
}

#[test]
fn policy_commands_refuse_a_server() {
    let sandbox = with_policies();
    sandbox
        .run(&["--server", "http://127.0.0.1:9", "policy", "validate"])
        .fails()
        .says("works on the local installation");
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
async fn sighup_reloads_the_policies_and_a_bad_file_keeps_those_in_force() {
    let sandbox = with_policies();
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
    let _ready = serve.json().await;

    std::fs::write(
        sandbox.path().join("policies/more.cedar"),
        "@id(\"x\") permit (principal, action, resource);",
    )
    .unwrap();
    serve.signal("HUP");
    until_logged(
        &mut serve,
        "policies reloaded: 7 policies from policies/more.cedar, policies/tools.cedar",
    )
    .await;

    std::fs::write(sandbox.path().join("policies/hr.cedar"), DEPARTMENT).unwrap();
    serve.signal("HUP");
    let line = until_logged(&mut serve, "did not reload").await;
    assert!(line.contains("policies/hr.cedar:5"), "{line}");
    assert!(line.contains("previous one stays in force"), "{line}");
    assert!(!serve.has_exited(), "a bad policy file never stops serve");
}

#[test]
fn a_model_call_no_policy_permits_is_not_made_and_the_run_fails_saying_why() {
    let sandbox = with_policies();
    std::fs::write(
        sandbox.path().join("plan.json"),
        json!([{"text": "done"}]).to_string(),
    )
    .unwrap();
    sandbox.append_config("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    sandbox
        .run(&["run", "--agent", "a", "hello"])
        .fails()
        .says("the call to model scripted was not made: denied: no policy permits this");
    std::fs::write(
        sandbox.path().join("policies/models.cedar"),
        "@id(\"plans\") permit (principal == Agent::\"a\", action == Action::\"call_model\", resource == Model::\"scripted\");",
    )
    .unwrap();
    sandbox
        .run(&["run", "--agent", "a", "hello"])
        .ok()
        .says("done");
}

/// How many `tools/call` requests the MCP server has seen since the last look.
fn tool_calls(mcp: &mut runwarden_testkit::TestServer) -> usize {
    mcp.drain_requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("\"tools/call\""))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_a_server_s_credential_uses_must_be_permitted_too() {
    use runwarden_testkit::{TestServer, mcp_handler, tool};
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let plan = json!([
        {"tool_calls": [{"name": "srv__create", "arguments": {"q": "x"}}]},
        {"text": "done"}
    ]);
    let sandbox = crate::support::serve::install(&mcp, plan).await;
    std::fs::create_dir(sandbox.path().join("policies")).unwrap();
    std::fs::write(
        sandbox.path().join("policies/base.cedar"),
        "@id(\"models\") permit (principal, action == Action::\"call_model\", resource);\n@id(\"srv\") permit (principal, action == Action::\"call_tool\", resource) when { resource.server == \"srv\" };\n",
    )
    .unwrap();
    sandbox.append_config("\n[policy]\nfiles = [\"policies/*.cedar\"]\n");
    let _ = tool_calls(&mut mcp);

    let out = crate::support::runwarden(&sandbox, &["--json", "run", "--agent", "a", "go"]).await;
    assert!(
        out.all().contains("denied: no policy permits this"),
        "the secret is not permitted: {out:#?}"
    );
    assert_eq!(tool_calls(&mut mcp), 0, "nothing reached the server");

    std::fs::write(
        sandbox.path().join("policies/secrets.cedar"),
        "@id(\"srv-token\") permit (principal, action == Action::\"read_secret\", resource == Secret::\"srv-token\");\n",
    )
    .unwrap();
    crate::support::runwarden(&sandbox, &["--json", "run", "--agent", "a", "go"])
        .await
        .ok();
    assert_eq!(tool_calls(&mut mcp), 1, "permitted, the call is made once");
}

#[test]
fn an_agents_configured_tags_are_what_its_policies_read_as_principal_tags() {
    let sandbox = Sandbox::initialised();
    std::fs::create_dir(sandbox.path().join("policies")).unwrap();
    let finance = "@id(\"finance-pays\")\npermit (principal, action == Action::\"call_tool\", resource == Tool::\"bank__pay\")\nwhen { principal.tags.contains(\"finance\") };\n";
    std::fs::write(sandbox.path().join("policies/pay.cedar"), finance).unwrap();
    std::fs::write(sandbox.path().join("plan.json"), "[]").unwrap();
    sandbox.append_config(
        "\n[policy]\nfiles = [\"policies/*.cedar\"]\n\n[agents.payer]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntags = [\"finance\"]\n\n[agents.other]\nprovider = \"scripted\"\nscript = \"plan.json\"\n",
    );
    let pays = eval(&sandbox, "payer", "bank__pay", json!({"amount": 5}));
    assert_eq!(
        pays,
        json!({"decision": "allow", "policies": ["finance-pays"], "reasons": []})
    );
    assert_eq!(
        eval(&sandbox, "other", "bank__pay", json!({"amount": 5}))["decision"],
        "deny"
    );
    // A tag that is free text is refused when the configuration is read.
    sandbox.append_config(
        "\n[agents.bad]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntags = [\"two words\"]\n",
    );
    sandbox
        .run(&["policy", "validate"])
        .fails()
        .says("is not a tag");
    sandbox
        .run(&["serve", "--listen", "127.0.0.1:0"])
        .fails()
        .says("[agents.bad] tags: tag \"two words\" is not a tag");
}

#[test]
fn the_checks_refuse_what_run_would_refuse_and_name_an_unknown_agent() {
    let sandbox = with_policies();
    // An agent the configuration lacks is said, so a typo is not taken for a decision.
    sandbox
        .run(&[
            "policy",
            "eval",
            "--agent",
            "nobody",
            "--tool",
            "files__write",
            "--args",
            "{}",
        ])
        .ok()
        .says("no agent named \"nobody\"");
    // A configuration `run` refuses is refused by the checks too.
    sandbox.append_config(
        "\n[agents.bad]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntags = [\"two words\"]\n",
    );
    sandbox
        .run(&["policy", "validate"])
        .fails()
        .says("does not load")
        .says("is not a tag");
}

#[test]
fn a_failed_case_shows_why_the_policies_decided_otherwise() {
    let sandbox = with_policies();
    let cases = "[[case]]\nagent = \"helper\"\ntool = \"files__write\"\nargs = { path = \"/etc/passwd\" }\nexpect = \"allow\"\n";
    std::fs::write(sandbox.path().join("cases.toml"), cases).unwrap();
    let cases = sandbox.path().join("cases.toml");
    sandbox
        .run(&["policy", "test", cases.to_str().unwrap()])
        .fails()
        .says("FAIL")
        .says("reason: writes stay under /srv");
}

#[test]
fn an_empty_set_of_policies_is_valid_but_said_to_deny_every_call() {
    let sandbox = Sandbox::initialised();
    sandbox.append_config("\n[policy]\nfiles = []\n");
    sandbox
        .run(&["policy", "validate"])
        .ok()
        .says("valid: 0 policies")
        .says("every call will be denied");
}
