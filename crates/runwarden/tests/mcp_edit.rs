//! `runwarden mcp add|remove`: the configuration file edited in place, comments and mode
//! kept, checked by the loader before anything is written.

use std::os::unix::fs::PermissionsExt;

use crate::support::Sandbox;

/// A comment of the operator's own, which an edit must keep.
const NOTE: &str = "# our note: the tickets server is owned by the helpdesk team\n";

fn sandbox_with_a_note() -> Sandbox {
    let sandbox = Sandbox::initialised();
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    std::fs::write(sandbox.config(), format!("{NOTE}{text}")).unwrap();
    std::fs::set_permissions(sandbox.config(), std::fs::Permissions::from_mode(0o640)).unwrap();
    sandbox
}

fn config_text(sandbox: &Sandbox) -> String {
    std::fs::read_to_string(sandbox.config()).unwrap()
}

/// Files the edit staged next to the configuration and did not clean up.
fn leftovers(sandbox: &Sandbox) -> Vec<String> {
    std::fs::read_dir(sandbox.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".runwarden.toml."))
        .collect()
}

#[test]
fn mcp_add_declares_a_server_that_loads_keeping_the_files_comments_order_and_mode() {
    let sandbox = sandbox_with_a_note();
    let before = config_text(&sandbox);
    sandbox
        .run(&[
            "mcp",
            "add",
            "tickets",
            "https://mcp.example.com/mcp",
            "--auth-secret",
            "tickets-token",
            "--placement",
            "header",
            "--header",
            "X-Api-Key",
            "--prefix",
            "Key ",
            "--effect",
            "read_only",
            "--timeout",
            "5",
        ])
        .ok()
        .says("added MCP server tickets")
        .says("runwarden mcp import tickets");
    let after = config_text(&sandbox);
    assert!(
        after.starts_with(&before),
        "everything that was in the file is still there, in its order:\n{after}"
    );
    assert!(after.contains(NOTE));
    assert!(
        after.ends_with(
            "[mcp.servers.tickets]\nurl = \"https://mcp.example.com/mcp\"\nauth = { secret = \"tickets-token\", placement = \"header\", header = \"X-Api-Key\", prefix = \"Key \" }\neffect = \"read_only\"\ntimeout_seconds = 5\n"
        ),
        "{after}"
    );
    let mode = std::fs::metadata(sandbox.config())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640, "the file keeps its mode");
    assert!(leftovers(&sandbox).is_empty());

    // Every command reads it: the server is listed with the declared effect and budget.
    let listed = sandbox.run(&["--json", "mcp", "list"]).ok().json();
    assert_eq!(listed[0]["name"], "tickets", "{listed}");
    assert_eq!(listed[0]["effect"], "read_only");
    assert_eq!(listed[0]["timeout_seconds"], 5);
}

#[test]
fn mcp_add_refuses_a_duplicate_and_a_bad_declaration_and_leaves_the_file_as_it_was() {
    let sandbox = sandbox_with_a_note();
    sandbox
        .run(&["mcp", "add", "tickets", "https://mcp.example.com/mcp"])
        .ok();
    let before = config_text(&sandbox);
    for (args, expected) in [
        (
            vec!["mcp", "add", "tickets", "https://other.example/mcp"],
            "an MCP server named \"tickets\" is already in",
        ),
        (
            vec!["mcp", "add", "files", "mcp.example.com/mcp"],
            "mcp.servers.files.url: ",
        ),
        (
            vec![
                "mcp",
                "add",
                "files",
                "https://f.example/mcp",
                "--effect",
                "harmless",
            ],
            "mcp.servers.files.effect: unknown effect \"harmless\"",
        ),
        (
            vec![
                "mcp",
                "add",
                "files",
                "https://f.example/mcp",
                "--auth-secret",
                "s",
                "--placement",
                "header",
            ],
            "auth placement \"header\" needs header",
        ),
        (
            vec![
                "mcp",
                "add",
                "files",
                "https://f.example/mcp",
                "--timeout",
                "0",
            ],
            "timeout_seconds must be a number of seconds",
        ),
        (
            vec!["mcp", "add", "a__b", "https://f.example/mcp"],
            "a server name is 1 to 32 characters",
        ),
    ] {
        let failed = sandbox.run(&args).fails().says(expected);
        assert!(
            failed.stderr.contains("is unchanged") || expected.contains("already"),
            "the refusal says the file was not touched: {failed:#?}"
        );
        assert_eq!(config_text(&sandbox), before, "{args:?} changed the file");
    }
    assert!(leftovers(&sandbox).is_empty(), "{:?}", leftovers(&sandbox));
}

#[test]
fn mcp_remove_of_an_unknown_name_names_the_configured_ones_and_add_then_remove_restores_the_file() {
    let sandbox = sandbox_with_a_note();
    let original = config_text(&sandbox);
    sandbox
        .run(&["mcp", "remove", "tickets"])
        .fails()
        .says("no MCP server named \"tickets\"")
        .says("none is configured");
    for name in ["tickets", "files"] {
        sandbox
            .run(&["mcp", "add", name, "https://mcp.example.com/mcp"])
            .ok();
    }
    sandbox
        .run(&["mcp", "remove", "tikets"])
        .fails()
        .says("the configured ones are files, tickets");
    sandbox
        .run(&["mcp", "remove", "tickets"])
        .ok()
        .says("removed MCP server tickets");
    let listed = sandbox.run(&["--json", "mcp", "list"]).ok().json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "files");
    sandbox.run(&["mcp", "remove", "files"]).ok();
    assert_eq!(
        config_text(&sandbox),
        original,
        "adding then removing servers leaves the file byte for byte as it was, comments included"
    );
}
