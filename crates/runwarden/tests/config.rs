//! `runwarden.toml` and its environment overrides (O3).

use crate::support::{Sandbox, TestServer};

#[test]
fn a_config_file_with_an_unknown_key_fails_naming_the_key() {
    let sandbox = Sandbox::initialised();
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    std::fs::write(
        sandbox.config(),
        text.replace("[egress]\n", "[egress]\nallowed_hosts = []\n"),
    )
    .unwrap();
    sandbox
        .run(&["secret", "list"])
        .fails()
        .says("allowed_hosts")
        .says(&sandbox.config().display().to_string());
}

#[test]
fn an_unknown_top_level_key_is_named_too() {
    let sandbox = Sandbox::initialised();
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    std::fs::write(sandbox.config(), format!("datadir = \"x\"\n{text}")).unwrap();
    sandbox.run(&["audit", "list"]).fails().says("datadir");
}

#[test]
fn runwarden_egress_allow_overrides_the_allowlist_in_the_file() {
    let sandbox = Sandbox::initialised();
    let server = TestServer::start();
    sandbox.run(&["egress", "test", &server.url("/")]).fails();
    let mut command = sandbox.command(&["egress", "test", &server.url("/")]);
    command.env("RUNWARDEN_EGRESS_ALLOW", "10.0.0.0/8, 127.0.0.1");
    sandbox.run_command(command).ok().says("HTTP 200");
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn runwarden_master_key_replaces_the_key_file() {
    let sandbox = Sandbox::initialised();
    sandbox.put("api", "value");
    let key = std::fs::read_to_string(sandbox.key_file()).unwrap();
    std::fs::remove_file(sandbox.key_file()).unwrap();
    let mut command = sandbox.command(&["secret", "list"]);
    command.env("RUNWARDEN_MASTER_KEY", key.trim());
    sandbox.run_command(command).ok().says("api");
}

#[test]
fn paths_in_the_config_are_relative_to_the_file_not_the_working_directory() {
    let sandbox = Sandbox::initialised();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut command = sandbox.command(&["secret", "list"]);
    command.current_dir(elsewhere.path());
    sandbox.run_command(command).ok();
}

#[test]
fn runwarden_config_names_the_file_when_there_is_no_flag() {
    let sandbox = Sandbox::initialised();
    sandbox.put("api", "value");
    let elsewhere = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_runwarden"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RUNWARDEN_") {
            command.env_remove(name);
        }
    }
    command
        .args(["secret", "list"])
        .env("RUNWARDEN_CONFIG", sandbox.config())
        .current_dir(elsewhere.path());
    sandbox.run_command(command).ok().says("api");
}
