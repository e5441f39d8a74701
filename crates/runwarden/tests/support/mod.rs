//! Helpers for the CLI tests: a scratch directory with its own config, the real binary run
//! as a subprocess with a clean environment, and a tiny HTTP server on 127.0.0.1. Every
//! test target of the binary includes this module; `serve` and `workers` hold the helpers
//! for a running server and for worker processes, `fault_checks` what a test checks once a
//! storage fault is removed, `secret_freshness` and `catalogue_freshness` scenarios two
//! targets run on their own stores.

pub(crate) mod catalogue_freshness;
pub(crate) mod fault_checks;
pub(crate) mod secret_freshness;
pub(crate) mod serve;
pub(crate) mod workers;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// A value that must never be printed; tests grep every output for it.
pub(crate) const SIGIL: &str = "sigil-5f0c2e91-DO-NOT-PRINT";

/// One scratch installation: a temporary directory holding `runwarden.toml` and the data
/// directory `init` creates next to it.
pub(crate) struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    /// An empty directory: nothing initialised.
    pub(crate) fn empty() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// A directory after a successful `runwarden init`.
    pub(crate) fn initialised() -> Self {
        let sandbox = Self::empty();
        sandbox.run(&["init"]).ok();
        sandbox
    }

    /// A directory inside `parent` (another file system, such as a small tmpfs) after a
    /// successful `runwarden init`.
    pub(crate) fn initialised_in(parent: &Path) -> Self {
        let sandbox = Self {
            dir: tempfile::tempdir_in(parent).expect("a directory in the parent"),
        };
        sandbox.run(&["init"]).ok();
        sandbox
    }

    /// A directory after `runwarden init` on the store at `url` (e.g. a PostgreSQL database
    /// of `TempCluster`), which its config then names in `[store] url`, so every command
    /// run here, and every node started here, uses that store (O3 amended).
    pub(crate) fn initialised_on(url: &str) -> Self {
        let sandbox = Self::empty();
        let mut init = sandbox.command(&["init"]);
        init.env("RUNWARDEN_DATABASE_URL", url);
        sandbox.run_command(init).ok();
        let text = std::fs::read_to_string(sandbox.config()).expect("init wrote the config");
        assert!(
            text.contains("\n[store]\n"),
            "the template changed:\n{text}"
        );
        let text = text.replace("\n[store]\n", &format!("\n[store]\nurl = \"{url}\"\n"));
        std::fs::write(sandbox.config(), text).expect("the config is writable");
        assert!(
            !sandbox.database().exists(),
            "no SQLite file with another store"
        );
        sandbox
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn config(&self) -> PathBuf {
        self.path().join("runwarden.toml")
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.path().join(".runwarden")
    }

    pub(crate) fn key_file(&self) -> PathBuf {
        self.data_dir().join("master.key")
    }

    pub(crate) fn database(&self) -> PathBuf {
        self.data_dir().join("runwarden.db")
    }

    /// Appends `text` (TOML tables) to the configuration file.
    pub(crate) fn append_config(&self, text: &str) {
        let mut config = std::fs::read_to_string(self.config()).expect("the config exists");
        config.push('\n');
        config.push_str(text);
        std::fs::write(self.config(), config).expect("the config is writable");
    }

    /// Agent `name` of the scripted provider: `plan` written beside the configuration, and
    /// the tool pattern `tools` bound.
    pub(crate) fn add_scripted_agent(&self, name: &str, plan: &Value, tools: &str) {
        std::fs::write(self.path().join(format!("{name}.json")), plan.to_string())
            .expect("the plan is writable");
        self.append_config(&format!(
            "[agents.{name}]\nprovider = \"scripted\"\nscript = \"{name}.json\"\ntools = [\"{tools}\"]\n"
        ));
    }

    /// Admits `127.0.0.1` in the config's egress allowlist, so tests can reach their server.
    pub(crate) fn allow_loopback(&self) {
        let text = std::fs::read_to_string(self.config()).expect("the config exists");
        assert!(
            text.contains("\nallow = []\n"),
            "the template changed:\n{text}"
        );
        let text = text.replace("\nallow = []\n", "\nallow = [\"127.0.0.1\"]\n");
        std::fs::write(self.config(), text).expect("the config is writable");
    }

    /// The binary with `--config` pointing here, run from this directory, and no
    /// `RUNWARDEN_*` variable from the developer's environment.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runwarden"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RUNWARDEN_") {
                command.env_remove(name);
            }
        }
        command
            .arg("--config")
            .arg(self.config())
            .args(args)
            .current_dir(self.path())
            .stdin(Stdio::null());
        command
    }

    /// Runs the binary with no input.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        Output::of(self.command(args))
    }

    /// Runs the binary with `input` on standard input.
    pub(crate) fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut command = self.command(args);
        command.stdin(Stdio::piped());
        Output::with_stdin(command, input)
    }

    /// Runs a prepared command (extra variables set by the caller).
    pub(crate) fn run_command(&self, command: Command) -> Output {
        Output::of(command)
    }

    /// `secret put NAME` with `value` on stdin; must succeed.
    pub(crate) fn put(&self, name: &str, value: &str) -> Output {
        self.run_with_stdin(&["secret", "put", name], value.as_bytes())
            .ok()
    }
}

/// What one run of the binary printed and how it exited.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) args: String,
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Output {
    fn of(mut command: Command) -> Self {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let args = format!("{:?}", command.get_args().collect::<Vec<_>>());
        let output = command.output().expect("the binary runs");
        Self::from_output(args, output)
    }

    fn with_stdin(mut command: Command, input: &[u8]) -> Self {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let args = format!("{:?}", command.get_args().collect::<Vec<_>>());
        let mut child = command.spawn().expect("the binary runs");
        let written = child.stdin.take().expect("stdin is piped").write_all(input);
        // A command that fails before reading its input closes the pipe: not our concern.
        if let Err(e) = written
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            panic!("could not write the binary's input: {e}");
        }
        let output = child.wait_with_output().expect("the binary exits");
        Self::from_output(args, output)
    }

    fn from_output(args: String, output: std::process::Output) -> Self {
        Self {
            args,
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Stdout and stderr together, for "never printed" checks and messages.
    pub(crate) fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    /// Asserts exit status 0 and returns self.
    #[track_caller]
    pub(crate) fn ok(self) -> Self {
        assert_eq!(
            self.code,
            Some(0),
            "expected success from {}: {self:#?}",
            self.args
        );
        self
    }

    /// Asserts a non-zero exit (not a crash by signal) and returns self.
    #[track_caller]
    pub(crate) fn fails(self) -> Self {
        assert!(
            matches!(self.code, Some(code) if code != 0),
            "expected a non-zero exit from {}: {self:#?}",
            self.args
        );
        self
    }

    /// Asserts that stdout and stderr together contain `needle`.
    #[track_caller]
    pub(crate) fn says(self, needle: &str) -> Self {
        assert!(
            self.all().contains(needle),
            "expected {needle:?} in the output of {self:#?}"
        );
        self
    }

    /// Stdout parsed as one JSON document.
    #[track_caller]
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:#?}"))
    }
}

/// An HTTP/1.1 server on 127.0.0.1 that answers every request `200 ok` and keeps the raw
/// request text (head and body), for tests that drive the binary without a runtime of
/// their own: the testkit's server, run on a thread of its own. It records a request
/// before it answers: once the client has its response, the request is in
/// [`TestServer::requests`]. No waiting needed.
pub(crate) struct TestServer {
    server: Mutex<runwarden_testkit::TestServer>,
    seen: Mutex<Vec<String>>,
    /// Dropped last: ends the thread that runs the server.
    _stop: oneshot::Sender<()>,
}

impl TestServer {
    /// Ready to accept as soon as this returns (the socket is bound and listening).
    pub(crate) fn start() -> Self {
        let (started, server) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the test server");
            runtime.block_on(async move {
                let server = runwarden_testkit::TestServer::start(|_| {
                    runwarden_testkit::HttpReply::text(200, "ok")
                })
                .await;
                let _ = started.send(server);
                let _ = stopped.await;
            });
        });
        let server = server.recv().expect("the test server started");
        Self {
            server: Mutex::new(server),
            seen: Mutex::default(),
            _stop: stop,
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        self.server.lock().expect("not poisoned").url(path)
    }

    /// Every raw request received so far, oldest first.
    pub(crate) fn requests(&self) -> Vec<String> {
        let fresh = self.server.lock().expect("not poisoned").drain_requests();
        let mut seen = self.seen.lock().expect("not poisoned");
        seen.extend(fresh.into_iter().map(|request| request.raw));
        seen.clone()
    }

    /// The only request received; fails if there were none or several.
    #[track_caller]
    pub(crate) fn only_request(&self) -> String {
        let requests = self.requests();
        assert_eq!(requests.len(), 1, "expected one request, got {requests:#?}");
        requests.into_iter().next().expect("one request")
    }
}

/// The value of header `name` (any case) in a raw request, if present.
pub(crate) fn header(request: &str, name: &str) -> Option<String> {
    request
        .split("\r\n")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}

/// The request line's target (`/path?query`) of a raw request.
pub(crate) fn target(request: &str) -> &str {
    request.split(' ').nth(1).unwrap_or_default()
}

/// How long a [`Live`] child may take to print its next line.
const LIVE_WAIT: Duration = Duration::from_secs(10);

/// A `runwarden` child whose output the test reads line by line as it comes.
pub(crate) struct Live {
    pub(crate) pid: u32,
    pub(crate) stdout: mpsc::UnboundedReceiver<String>,
    pub(crate) stderr: mpsc::UnboundedReceiver<String>,
    pub(crate) exit: oneshot::Receiver<(Option<i32>, Instant)>,
    pub(crate) reaped: Arc<AtomicBool>,
}

/// How a [`Live`] child ended and what it printed after the lines already read.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) code: Option<i32>,
    pub(crate) took: Duration,
    pub(crate) stdout: Vec<String>,
    pub(crate) stderr: Vec<String>,
}

pub(crate) fn lines(reader: impl Read + Send + 'static) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Live {
    pub(crate) fn start(sandbox: &Sandbox, args: &[&str]) -> Self {
        Self::spawn(sandbox.command(args))
    }

    /// Starts a prepared command (extra variables set by the caller).
    pub(crate) fn spawn(mut command: Command) -> Self {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("the binary starts");
        let pid = child.id();
        let stdout = lines(child.stdout.take().expect("stdout is piped"));
        let stderr = lines(child.stderr.take().expect("stderr is piped"));
        let (tx, exit) = oneshot::channel();
        let reaped = Arc::new(AtomicBool::new(false));
        let flag = reaped.clone();
        std::thread::spawn(move || {
            let status = child.wait().expect("the child can be waited for");
            let at = Instant::now();
            flag.store(true, Ordering::SeqCst);
            let _ = tx.send((status.code(), at));
        });
        Self {
            pid,
            stdout,
            stderr,
            exit,
            reaped,
        }
    }

    /// The next line on stdout.
    pub(crate) async fn line(&mut self) -> String {
        tokio::time::timeout(LIVE_WAIT, self.stdout.recv())
            .await
            .expect("a line on stdout in time")
            .expect("stdout ended early")
    }

    /// The next line on stderr.
    pub(crate) async fn err_line(&mut self) -> String {
        tokio::time::timeout(LIVE_WAIT, self.stderr.recv())
            .await
            .expect("a line on stderr in time")
            .expect("stderr ended early")
    }

    /// The next stdout line as JSON.
    pub(crate) async fn json(&mut self) -> Value {
        let line = self.line().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    pub(crate) fn has_exited(&mut self) -> bool {
        !matches!(
            self.exit.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        )
    }

    pub(crate) fn signal(&self, name: &str) {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{name} {} failed", self.pid);
    }

    /// Waits for the exit (failing after `bound` plus [`LIVE_WAIT`], so a slow exit is reported
    /// with its duration), then reads the rest of its output.
    pub(crate) async fn ended(&mut self, since: Instant, bound: Duration) -> Ended {
        let (code, at) = tokio::time::timeout(bound + LIVE_WAIT, &mut self.exit)
            .await
            .unwrap_or_else(|_| panic!("the command did not exit within {:?}", bound + LIVE_WAIT))
            .expect("the waiter reports the exit");
        let mut ended = Ended {
            code,
            took: at.saturating_duration_since(since),
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        while let Some(line) = tokio::time::timeout(LIVE_WAIT, self.stdout.recv())
            .await
            .expect("stdout closes after the exit")
        {
            ended.stdout.push(line);
        }
        while let Some(line) = tokio::time::timeout(LIVE_WAIT, self.stderr.recv())
            .await
            .expect("stderr closes after the exit")
        {
            ended.stderr.push(line);
        }
        assert!(
            ended.took < bound,
            "the command took {:?} to exit (bound {bound:?}): {ended:#?}",
            ended.took
        );
        ended
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // A test that failed half-way must not leave a stalled run behind.
        if !self.reaped.load(Ordering::SeqCst) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
    }
}

/// Runs the binary off the async runtime, so the test's servers keep answering.
pub(crate) async fn runwarden(sandbox: &Arc<Sandbox>, args: &[&str]) -> Output {
    let (sandbox, args) = (
        sandbox.clone(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    tokio::task::spawn_blocking(move || {
        sandbox.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap()
}

/// A plan whose first turn calls the tool the server never answers.
pub(crate) fn call_the_stalling_tool() -> Value {
    json!([
        {"tool_calls": [{"name": "srv__stall", "arguments": {"q": "printer"}}]},
        {"text": "never reached"}
    ])
}

/// `runwarden serve` on a free port with no workers; answers the process and its ready
/// line (`url`, and `metrics` when a metrics listener is configured).
pub(crate) async fn serve_api(sandbox: &Sandbox) -> (Live, Value) {
    let mut live = Live::start(
        sandbox,
        &[
            "--json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--concurrency",
            "0",
        ],
    );
    let ready: Value = live.json().await;
    assert!(
        ready["url"].is_string(),
        "the ready line names the url: {ready}"
    );
    (live, ready)
}
