//! docs/getting-started.md, executed: every `sh` block, in order, as one bash script in a
//! scratch directory that sees the repository's `scripts/` and `tests/`, with the built
//! `runwarden` first on the PATH (the guide's `cargo install` result) and free ports.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// The guide's fenced `sh` blocks, in order.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_getting_started_guide_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guide = std::fs::read_to_string(root.join("docs/getting-started.md")).unwrap();
    let blocks = sh_blocks(&guide);
    assert!(blocks.len() >= 5, "the guide's sh blocks: {blocks:?}");
    let dir = tempfile::tempdir().unwrap();
    for name in ["scripts", "tests"] {
        std::os::unix::fs::symlink(
            root.join(name).canonicalize().unwrap(),
            dir.path().join(name),
        )
        .unwrap();
    }
    let script = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{}",
        blocks.join("\n")
    );
    let binary = Path::new(env!("CARGO_BIN_EXE_runwarden"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("timeout")
        .args(["300", "bash", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("LLAMA_PORT", free_port().to_string())
        .env("MCP_PORT", free_port().to_string())
        .env_remove("RUNWARDEN_CONFIG")
        .env_remove("RUNWARDEN_DATA_DIR")
        .env_remove("RUNWARDEN_MASTER_KEY")
        .env_remove("RUNWARDEN_SERVER")
        .output()
        .expect("run the guide");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let llama_log = std::fs::read_to_string(dir.path().join("llama.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "the guide failed ({}):\n{stdout}\n{stderr}\nllama.log tail:\n{}",
        output.status,
        llama_log
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        stdout.contains("peer__create_ticket"),
        "the import: {stdout}"
    );
    assert!(stdout.contains("cancelled"), "the cancel: {stdout}");
    assert!(stdout.contains("intact"), "the audit verify: {stdout}");
}
