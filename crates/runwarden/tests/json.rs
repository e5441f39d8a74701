//! `--json`: every command prints one JSON document on stdout, errors included.

use crate::support::{Sandbox, TestServer};

#[test]
fn every_command_prints_valid_json_with_the_json_flag() {
    let sandbox = Sandbox::empty();
    let init = sandbox.run(&["--json", "init"]).ok().json();
    assert_eq!(init["config_written"], true);
    assert!(init["master_key_id"].is_string());
    sandbox.allow_loopback();

    let put = sandbox
        .run_with_stdin(&["--json", "secret", "put", "api"], b"value")
        .ok()
        .json();
    assert_eq!(
        put,
        serde_json::json!({ "name": "api", "result": "stored" })
    );
    assert!(
        sandbox
            .run(&["--json", "secret", "list"])
            .ok()
            .json()
            .is_array()
    );

    let server = TestServer::start();
    let sent = sandbox
        .run(&["--json", "egress", "test", &server.url("/")])
        .ok()
        .json();
    assert_eq!(sent["status"], 200);
    let refused = sandbox
        .run(&["--json", "egress", "test", "http://10.9.9.9/"])
        .fails()
        .json();
    assert!(refused["error"].is_string());

    assert!(
        sandbox
            .run(&["--json", "audit", "list"])
            .ok()
            .json()
            .is_array()
    );
    assert_eq!(
        sandbox.run(&["--json", "audit", "verify"]).ok().json()["intact"],
        true
    );
    let new_key = sandbox.path().join("new.key");
    let rotated = sandbox
        .run(&[
            "--json",
            "secret",
            "rotate-master-key",
            "--new-key-file",
            new_key.to_str().unwrap(),
        ])
        .ok()
        .json();
    assert!(rotated["rewrapped"].is_u64());
    let removed = sandbox.run(&["--json", "secret", "rm", "api"]).ok().json();
    assert_eq!(removed["result"], "removed");
}

#[test]
fn errors_are_json_too_with_the_json_flag() {
    let sandbox = Sandbox::initialised();
    let out = sandbox.run(&["--json", "secret", "rm", "nope"]).fails();
    let message = out.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("no secret named"), "{message}");

    let second_init = sandbox.run(&["--json", "init"]).fails().json();
    assert!(second_init["error"]["message"].is_string());
}
