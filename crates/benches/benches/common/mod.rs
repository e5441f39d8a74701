//! What the binary's benches share: the binary (built beforehand with
//! `cargo build --release -p runwarden`) run with a clean environment, and a child process
//! that is killed when dropped.

#![allow(dead_code)] // each bench uses some of these

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::SystemTime;

/// The crates the binary is built from: a source newer than the binary means it is stale.
const BINARY_CRATES: [&str; 7] = [
    "vault",
    "mcp",
    "models",
    "runtime",
    "store-sqlite",
    "store-postgres",
    "runwarden",
];

/// The binary to run: `BENCH_RUNWARDEN_BIN` when set (another commit's build, so two
/// commits are measured by one harness back to back), else [`built_binary`].
pub(crate) fn bin() -> std::ffi::OsString {
    std::env::var_os("BENCH_RUNWARDEN_BIN").unwrap_or_else(|| built_binary().into())
}

/// The `runwarden` binary Cargo built in this bench's own profile directory
/// (`target/release` for `cargo bench`). Cargo hands a bench the path of a binary only in
/// the binary's own package, so this crate finds it there, and refuses one that is missing
/// or older than the sources it is built from rather than measure something else.
pub(crate) fn built_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    // target/<profile>/deps/<bench>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the bench runs from target/<profile>/deps");
    let binary = profile_dir.join("runwarden");
    let build = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "cargo build -p runwarden",
        _ => "cargo build --release -p runwarden",
    };
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: build it first with `{build}`",
                binary.display()
            )
        });
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("crates/benches sits two levels under the workspace");
    let mut sources = vec![workspace.join("Cargo.lock")];
    for krate in BINARY_CRATES {
        let dir = workspace.join("crates").join(krate);
        sources.push(dir.join("Cargo.toml"));
        sources.push(dir.join("src"));
        sources.push(dir.join("migrations"));
    }
    if let Some(newer) = sources.iter().find_map(|path| newer_than(path, built)) {
        panic!(
            "{} is older than {}: rebuild it with `{build}`",
            binary.display(),
            newer.display()
        );
    }
    binary
}

/// A file at or under `path` modified after `time`, if any.
fn newer_than(path: &Path, time: SystemTime) -> Option<PathBuf> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_dir() {
        let entries = std::fs::read_dir(path).ok()?;
        return entries
            .flatten()
            .find_map(|entry| newer_than(&entry.path(), time));
    }
    (meta.modified().ok()? > time).then(|| path.to_path_buf())
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
