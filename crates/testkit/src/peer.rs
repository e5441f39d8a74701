//! The real MCP peers: the official Python SDK serving `tests/peer/server.py` (and 1.x,
//! and fastmcp), each started in its own process for one test and killed when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a peer may take to print `READY` (imports take 1-2 s; CI machines are slow).
const STARTUP: Duration = Duration::from_secs(60);

/// The repository root (two levels above any crate's manifest directory).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's Python, `$RUNWARDEN_PEER_PYTHON` (what `scripts/peer-venv.sh` prints last;
/// `.ci/run` sets it). A test without it fails at once, saying so.
fn python() -> PathBuf {
    crate::required_path(
        "RUNWARDEN_PEER_PYTHON",
        "the real MCP peer (the official Python SDK and fastmcp in a venv)",
        "scripts/peer-venv.sh",
    )
}

/// A running peer server.
pub struct Peer {
    child: Child,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    /// Starts `server.py` with extra flags (`--stateless`, `--json-response`) and waits
    /// for its `READY <port>` line.
    pub fn start(flags: &[&str]) -> Self {
        Self::spawn(python(), "tests/peer/server.py", flags)
    }

    /// Starts the older peer, the Python SDK 1.x (`tests/peer1/server.py`, stateful, with
    /// sessions; `--json-response`), from its own venv (`$RUNWARDEN_PEER1_PYTHON`, what
    /// `scripts/peer1-venv.sh` prints last).
    pub fn start_v1(flags: &[&str]) -> Self {
        let python = crate::required_path(
            "RUNWARDEN_PEER1_PYTHON",
            "the older MCP peer (the Python SDK 1.x in a venv)",
            "scripts/peer1-venv.sh",
        );
        Self::spawn(python, "tests/peer1/server.py", flags)
    }

    /// Starts the fastmcp peer (`tests/peer/fastmcp_server.py`: fastmcp, the most used
    /// Python server framework; it offers 2026-07-28), from the same venv as
    /// [`Peer::start`]: fastmcp is pinned beside the SDK it builds on.
    pub fn start_fastmcp() -> Self {
        Self::spawn(python(), "tests/peer/fastmcp_server.py", &[])
    }

    fn spawn(python: PathBuf, script: &str, flags: &[&str]) -> Self {
        let mut child = Command::new(python)
            .arg(repo_root().join(script))
            .args(["--port", "0"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the MCP peer");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(port) = line.strip_prefix("READY ") {
                    let _ = tx.send(port.trim().parse::<u16>().ok());
                    return;
                }
            }
            let _ = tx.send(None);
        });
        let port = match rx.recv_timeout(STARTUP) {
            Ok(Some(port)) => port,
            other => {
                let _ = child.kill();
                panic!("the MCP peer did not print READY: {other:?}");
            }
        };
        Self { child, port }
    }

    /// The Streamable HTTP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The peer's counters (`GET /stats`), as JSON text.
    pub fn stats(&self) -> String {
        self.get("/stats")
    }

    /// The peer's counters (`GET /stats`), as JSON.
    pub fn stats_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stats()).expect("the peer's stats are JSON")
    }

    /// Waits, up to `within`, until the peer's counters satisfy `done`, and answers them.
    /// A peer handles a notification or a disconnect after it answered, so its counters
    /// move a moment later.
    pub async fn wait_for_stats(
        &self,
        within: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + within;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            let now = self.stats_json();
            if done(&now) {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the peer's counters never got there: {now}"
            );
        }
    }

    /// The body of a plain `GET` of `path` on the peer (`/stats`, `/wire-stats`).
    pub fn get(&self, path: &str) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the peer");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set a read timeout");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
        )
        .expect("send the GET");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .expect("read the answer");
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    }
}

/// The stdio peer (`tests/peer/stdio_server.py`, the official Python SDK over stdio): the
/// program and arguments that start it, for a local server's `command` and `args`.
pub fn stdio_peer() -> (String, Vec<String>) {
    let script = repo_root()
        .join("tests/peer/stdio_server.py")
        .canonicalize()
        .expect("tests/peer/stdio_server.py exists");
    (
        python().display().to_string(),
        vec![script.display().to_string()],
    )
}

/// The venv's Python ready to run `tests/peer/<script>`: a client of the official SDK
/// that a test drives (`gateway_client.py`).
pub fn peer_command(script: &str) -> Command {
    let script = repo_root()
        .join("tests/peer")
        .join(script)
        .canonicalize()
        .unwrap_or_else(|e| panic!("tests/peer/{script} exists: {e}"));
    let mut command = Command::new(python());
    command.arg(script);
    command
}

/// The live (not zombie) processes whose environment holds `variable` (`NAME=VALUE`): how
/// a test finds a local server by the host's pids (in its sandbox it is pid 1).
pub fn pids_with_env(variable: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == variable.as_bytes()))
        })
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                !stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        })
        .collect()
}
