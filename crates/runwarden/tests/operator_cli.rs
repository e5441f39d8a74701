//! The CLI an operator lives in: a named configuration must exist, `--server` is honoured
//! or refused (never ignored), `runs list`, shell completions, and the small things that
//! read wrong (exit codes, audit hosts, plurals, errors said once).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::{HttpReply, HttpRequest, Seen, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::serve::{Serve, install, token};
use crate::support::{Live, Output, Sandbox, call_the_stalling_tool, runwarden};

const WAIT: Duration = Duration::from_secs(10);

/// The binary with no `RUNWARDEN_*` variable and no `--config`, run in `dir`.
fn bare(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runwarden"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RUNWARDEN_") {
            command.env_remove(name);
        }
    }
    command.args(args).current_dir(dir);
    command
}

#[test]
fn a_named_configuration_file_that_does_not_exist_is_an_error_saying_how_to_create_one() {
    let sandbox = Sandbox::empty();
    let missing = sandbox.path().join("runwardn.toml");
    let missing_text = missing.display().to_string();
    let by_flag = sandbox.run_command(bare(
        sandbox.path(),
        &["--config", &missing_text, "mcp", "list"],
    ));
    let mut by_env = bare(sandbox.path(), &["mcp", "list"]);
    by_env.env("RUNWARDEN_CONFIG", &missing);
    let by_env = sandbox.run_command(by_env);
    for output in [by_flag, by_env] {
        assert_eq!(output.code, Some(2), "{output:#?}");
        let output = output
            .says(&missing_text)
            .says("does not exist")
            .says("run `runwarden init` with the same --config");
        assert!(!output.stdout.contains("No MCP servers"), "{output:#?}");
    }
    // Without either, the default discovery stays: no ./runwarden.toml means defaults,
    // and here the first thing missing is the database.
    let defaults = sandbox
        .run_command(bare(sandbox.path(), &["mcp", "list"]))
        .says("no database at")
        .says("run `runwarden init`");
    assert_eq!(defaults.code, Some(1), "{defaults:#?}");
    assert!(!defaults.stderr.contains("does not exist"), "{defaults:#?}");
    // `init` is how the named file comes to exist.
    sandbox
        .run_command(bare(sandbox.path(), &["--config", &missing_text, "init"]))
        .ok();
    assert!(missing.exists());
    sandbox
        .run_command(bare(
            sandbox.path(),
            &["--config", &missing_text, "mcp", "list"],
        ))
        .ok();
}

#[test]
fn server_is_refused_with_exit_2_by_commands_that_work_on_the_local_installation() {
    let sandbox = Sandbox::initialised();
    for args in [
        vec!["secret", "list"],
        vec!["init"],
        vec!["egress", "test", "https://example.com/"],
        vec!["mcp", "import", "srv"],
        vec!["mcp", "call", "srv", "search"],
        vec!["mcp", "add", "srv", "https://mcp.example.com/mcp"],
        vec!["mcp", "remove", "srv"],
        vec!["serve"],
        vec!["worker"],
        vec!["reap"],
        vec!["token", "list"],
    ] {
        let mut with_flag = vec!["--server", "http://127.0.0.1:9"];
        with_flag.extend(&args);
        let output = sandbox.run(&with_flag);
        assert_eq!(output.code, Some(2), "{output:#?}");
        output
            .says(&format!("`runwarden {}", args[0]))
            .says("works on the local installation")
            .says("drop --server");
    }
    let mut by_env = sandbox.command(&["secret", "list"]);
    by_env.env("RUNWARDEN_SERVER", "http://127.0.0.1:9");
    let output = sandbox.run_command(by_env);
    assert_eq!(output.code, Some(2), "{output:#?}");
    output.says("RUNWARDEN_SERVER");
    // `[client] server` is a default for the commands that can use it, not a refusal.
    sandbox.append_config("[client]\nserver = \"http://127.0.0.1:9\"\n");
    sandbox.run(&["secret", "list"]).ok();
}

#[test]
fn completions_are_generated_for_bash_zsh_and_fish_and_the_bash_script_parses() {
    let sandbox = Sandbox::empty();
    for shell in ["bash", "zsh", "fish"] {
        let script = sandbox
            .run_command(bare(sandbox.path(), &["completions", shell]))
            .ok()
            .stdout;
        assert!(script.len() > 1000, "{shell}: {script}");
        for subcommand in ["enqueue", "decisions"] {
            assert!(
                script.contains(subcommand),
                "{shell} completes {subcommand}"
            );
        }
        if shell == "bash" {
            let path = sandbox.path().join("runwarden.bash");
            std::fs::write(&path, &script).unwrap();
            let checked = Command::new("bash").arg("-n").arg(&path).output().unwrap();
            assert!(
                checked.status.success(),
                "bash -n: {}",
                String::from_utf8_lossy(&checked.stderr)
            );
        }
    }
}

/// Runs `args` on the store and through `serve` with `token`; both outputs.
async fn both_ways(
    sandbox: &Arc<Sandbox>,
    serve: &Serve,
    token: &str,
    args: &[&str],
) -> (Output, Output) {
    let on_store = runwarden(sandbox, args).await;
    let mut command = sandbox.command(args);
    command
        .env("RUNWARDEN_SERVER", serve.url())
        .env("RUNWARDEN_TOKEN", token);
    let sandbox = sandbox.clone();
    let through = tokio::task::spawn_blocking(move || sandbox.run_command(command))
        .await
        .unwrap();
    (on_store, through)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_mcp_list_and_audit_print_the_same_on_the_store_and_through_a_server() {
    let mcp = TestServer::start(mcp_handler(vec![tool("search")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    for _ in 0..2 {
        runwarden(&sandbox, &["run", "--agent", "b", "go"])
            .await
            .ok();
    }
    let queued = runwarden(&sandbox, &["enqueue", "--agent", "a", "later"])
        .await
        .ok()
        .stdout
        .trim()
        .to_string();
    let serve = Serve::start(&sandbox, 0).await; // no workers: the queued run stays queued
    let viewer = token(&sandbox, "viewer").await;

    for args in [
        vec!["runs", "list"],
        vec!["--json", "runs", "list"],
        vec!["--json", "runs", "list", "--status", "queued"],
        vec!["runs", "list", "--agent", "b", "--limit", "1"],
        vec!["mcp", "list"],
        vec!["--json", "mcp", "list"],
        vec!["audit", "list"],
        vec!["--json", "audit", "list", "--limit", "2"],
        vec!["audit", "verify"],
        vec!["--json", "audit", "verify"],
    ] {
        let (store, server) = both_ways(&sandbox, &serve, &viewer, &args).await;
        let (store, server) = (store.ok(), server.ok());
        assert_eq!(store.stdout, server.stdout, "{args:?}");
        assert!(!store.stdout.trim().is_empty(), "{args:?}");
    }

    let all = runwarden(&sandbox, &["--json", "runs", "list"])
        .await
        .ok()
        .json();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(all[0]["run_id"], queued.as_str(), "newest first");
    assert_eq!(all[0]["status"], "queued");
    assert!(all[1..].iter().all(|r| r["status"] == "completed"));
    let only_queued = runwarden(&sandbox, &["--json", "runs", "list", "--status", "queued"])
        .await
        .ok()
        .json();
    assert_eq!(only_queued.as_array().unwrap().len(), 1);
    let text = runwarden(&sandbox, &["runs", "list", "--agent", "b", "--limit", "1"])
        .await
        .ok()
        .stdout;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one run: {text}");
    assert!(
        lines[0].starts_with("RUN") && lines[1].contains("completed"),
        "{text}"
    );
    runwarden(&sandbox, &["runs", "list", "--status", "finished"])
        .await
        .fails()
        .says("unknown status \"finished\": use queued, running");

    // Through the server, health is the server's last contact (the import succeeded).
    let mut health = sandbox.command(&["mcp", "health"]);
    health
        .env("RUNWARDEN_SERVER", serve.url())
        .env("RUNWARDEN_TOKEN", &viewer);
    let sandbox_for_health = sandbox.clone();
    tokio::task::spawn_blocking(move || sandbox_for_health.run_command(health))
        .await
        .unwrap()
        .ok()
        .says("srv: up at its last contact; last success");
}

fn method(request: &HttpRequest) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    body["method"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_a_server_prints_its_events_and_ctrl_c_cancels_it_through_the_api() {
    let mut mcp = TestServer::start(mcp_handler(vec![tool("stall")], &["stall"])).await;
    let sandbox = install(&mcp, call_the_stalling_tool()).await;
    mcp.drain_requests();
    let serve = Serve::start(&sandbox, 1).await; // one worker slot executes it
    let operator = token(&sandbox, "operator").await;

    let mut command = sandbox.command(&["run", "--agent", "a", "open a ticket"]);
    command
        .env("RUNWARDEN_SERVER", serve.url())
        .env("RUNWARDEN_TOKEN", &operator);
    let mut run = Live::spawn(command);
    let queued = run.err_line().await;
    assert!(
        queued.contains("queued on the server (Ctrl-C cancels it)"),
        "{queued}"
    );
    // The server's worker makes the call; the CLI prints the events as they come.
    while method(&mcp.next_request(WAIT).await) != "tools/call" {}
    let started = run.line().await;
    assert!(started.contains("started: agent a"), "{started}");
    let asked = run.line().await;
    assert!(asked.contains("model asked for srv__stall"), "{asked}");

    run.signal("INT");
    let signalled = Instant::now();
    // R4: the server's hub wakes the call in flight; the MCP server sees the close.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = tokio::time::timeout_at(deadline, mcp.events.recv())
            .await
            .expect("the MCP server saw the call close in time")
            .expect("the test server runs");
        if matches!(seen, Seen::Closed(_)) {
            break;
        }
    }
    let ended = run.ended(signalled, WAIT).await;
    assert_eq!(ended.code, Some(130), "{ended:#?}");
    let summary = ended
        .stdout
        .iter()
        .find(|l| l.starts_with("run ") && l.contains(" cancelled: cancelled by an operator"))
        .cloned()
        .unwrap_or_else(|| panic!("a summary line: {ended:#?}"));
    assert!(
        ended
            .stdout
            .iter()
            .any(|l| l.contains("non_idempotent_write was in flight")),
        "R7: the fence is reported: {ended:#?}"
    );
    let status = runwarden(
        &sandbox,
        &["--json", "status", summary.split(' ').nth(1).unwrap()],
    )
    .await
    .ok()
    .json();
    assert_eq!(status["status"], "cancelled", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_test_fails_on_an_error_status_as_its_audit_row_says() {
    let server = TestServer::start(|_: &HttpRequest| HttpReply::text(404, "no such page")).await;
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let sandbox = Arc::new(sandbox);
    let output = runwarden(&sandbox, &["egress", "test", &server.url("/missing")]).await;
    assert_eq!(output.code, Some(1), "{output:#?}");
    output.says("HTTP 404").says(" FAILED ");
}

#[test]
fn refused_audit_rows_keep_the_port_and_another_scheme_is_shown_whole() {
    let sandbox = Sandbox::initialised(); // loopback not allowed: the guard refuses it
    sandbox
        .run(&["egress", "test", "http://127.0.0.1:9/x"])
        .fails();
    sandbox
        .run(&["egress", "test", "file:///etc/passwd"])
        .fails()
        .says("file:///etc/passwd");
    let rows = sandbox.run(&["--json", "audit", "list"]).ok().json();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["host"], "file://");
    assert_eq!(rows[0]["path"], "/etc/passwd");
    assert_eq!(rows[1]["action"], "http_call_refused");
    assert_eq!(rows[1]["host"], "127.0.0.1:9", "the port is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_call_counts_its_legs_in_words_and_an_import_error_says_each_cause_once() {
    let mcp = TestServer::start(mcp_handler(vec![tool("search")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    let args = ["mcp", "call", "srv", "search", "--args", "{\"q\": \"x\"}"];
    let text = runwarden(&sandbox, &args).await.ok().stdout;
    let mut json_args = vec!["--json"];
    json_args.extend(args);
    let legs = runwarden(&sandbox, &json_args).await.ok().json()["legs"]
        .as_array()
        .unwrap()
        .len();
    let said = if legs == 1 {
        "(1 leg, ".to_string()
    } else {
        format!("({legs} legs, ")
    };
    assert!(text.contains(&said), "{said} in {text}");

    sandbox.append_config(&format!(
        "[mcp.servers.locked]\nurl = \"{}\"\nauth = {{ secret = \"absent\", placement = \"bearer\" }}\n",
        mcp.url("/mcp")
    ));
    let failed = runwarden(&sandbox, &["mcp", "import", "locked"])
        .await
        .fails();
    assert_eq!(
        failed.stderr.matches("no secret named \"absent\"").count(),
        1,
        "{failed:#?}"
    );
    assert_eq!(failed.stderr.matches("error:").count(), 1, "{failed:#?}");
}
