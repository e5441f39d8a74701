//! `runwarden init`, and every other command when there is nothing to open.

use std::os::unix::fs::PermissionsExt;

use crate::support::Sandbox;

#[test]
fn init_writes_the_config_the_data_dir_the_database_and_a_0600_key_file() {
    let sandbox = Sandbox::empty();
    sandbox.run(&["init"]).ok().says("master key");

    let config = std::fs::read_to_string(sandbox.config()).unwrap();
    assert!(config.contains("data_dir = \".runwarden\""), "{config}");
    assert!(sandbox.data_dir().is_dir());
    assert!(sandbox.database().is_file());
    let key = std::fs::metadata(sandbox.key_file()).unwrap();
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(sandbox.key_file()).unwrap();
    let hex = text.trim();
    assert_eq!(hex.len(), 64, "a 32-byte key as hex: {hex:?}");
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn a_second_init_refuses_to_overwrite_the_key() {
    let sandbox = Sandbox::initialised();
    let before = std::fs::read(sandbox.key_file()).unwrap();

    sandbox
        .run(&["init"])
        .fails()
        .says("a master key already exists")
        .says("never replaces a key");

    assert_eq!(std::fs::read(sandbox.key_file()).unwrap(), before);
}

#[test]
fn init_refuses_while_a_master_key_is_set_in_the_environment() {
    let sandbox = Sandbox::empty();
    let mut command = sandbox.command(&["init"]);
    command.env("RUNWARDEN_MASTER_KEY", "00".repeat(32));
    sandbox
        .run_command(command)
        .fails()
        .says("RUNWARDEN_MASTER_KEY is set");
    assert!(!sandbox.key_file().exists());
}

/// Every command that opens the vault, with what it needs on the command line.
const KEYED_COMMANDS: &[&[&str]] = &[
    &["secret", "put", "x"],
    &["secret", "list"],
    &["secret", "rm", "x"],
    &["secret", "rotate-master-key", "--new-key-file", "new.key"],
    &["egress", "test", "http://10.0.0.1/"],
    &["audit", "list"],
    &["audit", "verify"],
];

#[test]
fn without_init_every_command_says_to_run_init_and_creates_no_key() {
    let sandbox = Sandbox::empty();
    for args in KEYED_COMMANDS {
        sandbox
            .run_with_stdin(args, b"value")
            .fails()
            .says("run `runwarden init`");
        assert!(!sandbox.key_file().exists(), "{args:?} created a key");
        assert!(!sandbox.database().exists(), "{args:?} created a database");
    }
    assert!(!sandbox.path().join("new.key").exists());
}

// `init` alone refuses over an existing installation, so the way on is to restore the key
// or to start over knowingly (`init --new-key`, tested in user_text.rs).
#[test]
fn with_the_key_file_gone_every_command_says_the_two_ways_on_and_creates_no_key() {
    let sandbox = Sandbox::initialised();
    std::fs::remove_file(sandbox.key_file()).unwrap();
    for args in KEYED_COMMANDS {
        sandbox
            .run_with_stdin(args, b"value")
            .fails()
            .says("no master key at")
            .says("restore the key from the backup")
            .says("`runwarden init --new-key`");
        assert!(!sandbox.key_file().exists(), "{args:?} created a key");
    }
}
