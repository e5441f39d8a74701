//! What the binary's benches share: the binary run with a clean environment, and a child
//! process that is killed when dropped.

#![allow(dead_code)] // each bench uses some of these

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// The release binary under measurement (Cargo sets this for benches too).
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_runwarden");

/// The binary to run: `BENCH_RUNWARDEN_BIN` when set (another commit's build, so two
/// commits are measured by one harness back to back), else [`BIN`].
pub(crate) fn bin() -> std::ffi::OsString {
    std::env::var_os("BENCH_RUNWARDEN_BIN").unwrap_or_else(|| BIN.into())
}

/// The binary with `--config CONFIG` and `args`, none of the caller's `RUNWARDEN_*`
/// variables (a developer's own settings must not leak into a figure), stdin closed.
pub(crate) fn command(config: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(bin());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RUNWARDEN_") {
            command.env_remove(name);
        }
    }
    command
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null());
    command
}

/// Runs the binary of the installation in `dir` to its end; it must succeed.
pub(crate) fn runwarden(dir: &Path, args: &[&str]) -> Output {
    let output = command(&dir.join("runwarden.toml"), args)
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A child process (a `serve`, a worker) killed and reaped when dropped, so a failed
/// bench leaves nothing running.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tokio runtime with one worker thread. The MCP server gets its own, so the timestamps
/// of the closes it sees are not delayed by the client's work.
pub(crate) fn one_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

/// An API token with `role` for the installation in `dir`.
pub(crate) fn token(dir: &Path, role: &str) -> String {
    let created: serde_json::Value = serde_json::from_slice(
        &runwarden(dir, &["--json", "token", "create", "--role", role]).stdout,
    )
    .expect("token create --json prints JSON");
    created["token"].as_str().expect("a token").to_string()
}

/// `runwarden serve` for `config` with `args` (after `--json`), stderr to `stderr`; waits
/// for its ready line and answers the child and the API's URL.
pub(crate) fn serve(
    mut command: Command,
    args: &[&str],
    stderr: impl Into<Stdio>,
) -> (KillOnDrop, String) {
    use std::io::{BufRead, BufReader};
    let mut child = command
        .arg("--json")
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("serve starts");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("stdout is piped"))
        .read_line(&mut ready)
        .expect("serve prints its ready line");
    let ready: serde_json::Value = serde_json::from_str(&ready).expect("the ready line is JSON");
    let url = ready["url"].as_str().expect("the ready line names the url");
    (KillOnDrop(child), url.to_string())
}
