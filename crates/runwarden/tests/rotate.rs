//! `runwarden secret rotate-master-key`: the new key is installed, the old one is dead.

use crate::support::{SIGIL, Sandbox, TestServer, header};

#[test]
fn rotation_installs_the_new_key_and_the_old_key_no_longer_opens_the_vault() {
    let sandbox = Sandbox::empty();
    let init = sandbox.run(&["--json", "init"]).ok().json();
    let old_id = init["master_key_id"].as_str().unwrap().to_string();
    sandbox.allow_loopback();
    sandbox.put("api", SIGIL);
    let old_key = sandbox.path().join("old.key");
    // fs::copy keeps the 0600 mode the vault insists on.
    std::fs::copy(sandbox.key_file(), &old_key).unwrap();

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
    let new_id = rotated["new_master_key_id"].as_str().unwrap().to_string();
    assert_ne!(new_id, old_id);
    assert_eq!(rotated["new_key_file_created"], true);
    assert_eq!(
        std::fs::read(sandbox.key_file()).unwrap(),
        std::fs::read(&new_key).unwrap(),
        "the new key is installed at the configured path"
    );

    // The configured key path works as before.
    let list = sandbox.run(&["--json", "secret", "list"]).ok().json();
    assert_eq!(list[0]["name"], "api");

    // The old key bytes open nothing any more, and the error names both keys.
    let mut command = sandbox.command(&["secret", "list"]);
    command.env("RUNWARDEN_MASTER_KEY_FILE", &old_key);
    sandbox
        .run_command(command)
        .fails()
        .says("sealed under master key")
        .says(&new_id)
        .says(&old_id);

    // The secret still decrypts to the same value at the wire.
    let server = TestServer::start();
    sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "api",
            "--placement",
            "bearer",
        ])
        .ok();
    let expected = format!("Bearer {SIGIL}");
    assert_eq!(
        header(&server.only_request(), "authorization").as_deref(),
        Some(&*expected)
    );
    sandbox.run(&["audit", "verify"]).ok();
}

#[test]
fn rotating_to_the_key_in_use_is_refused() {
    let sandbox = Sandbox::initialised();
    let same = sandbox.key_file();
    sandbox
        .run(&[
            "secret",
            "rotate-master-key",
            "--new-key-file",
            same.to_str().unwrap(),
        ])
        .fails()
        .says("the key in use");
}

#[test]
fn an_empty_runwarden_master_key_counts_as_unset_so_rotation_installs_the_key_file() {
    let sandbox = Sandbox::empty();
    let mut init = sandbox.command(&["init"]);
    init.env("RUNWARDEN_MASTER_KEY", "");
    sandbox.run_command(init).ok();
    sandbox.put("api", "value");

    let new_key = sandbox.path().join("new.key");
    let mut rotate = sandbox.command(&[
        "secret",
        "rotate-master-key",
        "--new-key-file",
        new_key.to_str().unwrap(),
    ]);
    rotate.env("RUNWARDEN_MASTER_KEY", "");
    sandbox
        .run_command(rotate)
        .ok()
        .says("installed the new key");
    sandbox.run(&["secret", "list"]).ok().says("api");
}

/// A rotation killed after its commit and before the new key was installed leaves every
/// secret under the new key while the configured file still holds the old one: running
/// the command again finishes it (installs the key), and every secret opens.
#[test]
fn a_rotation_stopped_after_its_commit_is_finished_by_running_it_again() {
    let sandbox = Sandbox::empty();
    sandbox.run(&["--json", "init"]).ok();
    sandbox.put("api", SIGIL);
    let old_key = sandbox.path().join("old.key");
    std::fs::copy(sandbox.key_file(), &old_key).unwrap();
    let new_key = sandbox.path().join("new.key");
    let rotate = [
        "--json",
        "secret",
        "rotate-master-key",
        "--new-key-file",
        new_key.to_str().unwrap(),
    ];
    sandbox.run(&rotate).ok();
    // The state a kill between the commit and the install leaves: the old key in place.
    std::fs::copy(&old_key, sandbox.key_file()).unwrap();
    sandbox.run(&["secret", "list"]).fails();

    let finished = sandbox.run(&rotate).ok().json();
    assert_eq!(finished["finished_a_stopped_rotation"], true, "{finished}");
    assert_eq!(
        std::fs::read(sandbox.key_file()).unwrap(),
        std::fs::read(&new_key).unwrap(),
        "the new key is installed"
    );
    let list = sandbox.run(&["--json", "secret", "list"]).ok().json();
    assert_eq!(list[0]["name"], "api");
}
