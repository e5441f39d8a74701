//! `runwarden serve` as a test drives it: an installation with an MCP server and a
//! bearer secret, tokens, a running server on a free port, and API and event-stream
//! clients that keep what they read.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use runwarden_testkit::TestServer;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{SIGIL, Sandbox, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);

/// An initialised sandbox admitting 127.0.0.1 with MCP server `srv` at `mcp` (its tools
/// imported; default effect, a non-idempotent write; a bearer secret holding [`SIGIL`])
/// and agent `a` replaying `plan` with the tools `srv__*`.
pub(crate) async fn install(mcp: &TestServer, plan: Value) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.put("srv-token", SIGIL);
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\nauth = {{ secret = \"srv-token\", placement = \"bearer\" }}\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\ntools = [\"srv__*\"]\n\n[agents.b]\nprovider = \"scripted\"\nscript = \"plan.json\"\n",
        mcp.url("/mcp")
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("plan.json"), plan.to_string()).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    sandbox
}

/// A token of `role`, from `token create --json`.
pub(crate) async fn token(sandbox: &Arc<Sandbox>, role: &str) -> String {
    named_token(sandbox, role, role).await
}

/// A new token of `role` called `name` (two live tokens never share a name).
pub(crate) async fn named_token(sandbox: &Arc<Sandbox>, role: &str, name: &str) -> String {
    let created = runwarden(
        sandbox,
        &["--json", "token", "create", "--role", role, "--name", name],
    )
    .await
    .ok()
    .json();
    assert_eq!(created["role"], role);
    created["token"].as_str().unwrap().to_string()
}

/// A running `runwarden serve` on a free port, killed on drop if the test did not stop it.
pub(crate) struct Serve {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) stdout: mpsc::UnboundedReceiver<String>,
}

impl Serve {
    pub(crate) async fn start(sandbox: &Sandbox, concurrency: usize) -> Self {
        let concurrency = concurrency.to_string();
        let mut command = sandbox.command(&[
            "--json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--concurrency",
            &concurrency,
        ]);
        command.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = command.spawn().expect("the binary starts");
        let (tx, mut stdout) = mpsc::unbounded_channel();
        let pipe = child.stdout.take().expect("stdout is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let ready = tokio::time::timeout(WAIT, stdout.recv())
            .await
            .expect("the ready line in time")
            .expect("serve printed its ready line");
        let ready: Value = serde_json::from_str(&ready).expect("the ready line is JSON");
        let url = ready["url"].as_str().expect("the ready line names the url");
        assert!(url.starts_with("http://127.0.0.1:"), "{ready}");
        Self {
            url: url.to_string(),
            child,
            stdout,
        }
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where the server listens.
    pub(crate) fn url(&self) -> String {
        self.url.clone()
    }

    pub(crate) fn signal(&self, name: &str) {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A client that remembers every answer body, to check none holds the sigil.
#[derive(Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    bodies: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Api {
    pub(crate) fn new(serve: &Serve) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: serve.url.clone(),
            bodies: Arc::default(),
        }
    }

    /// One request; the status and the body (JSON when it parses, else a string).
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<String>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = tokio::time::timeout(WAIT * 3, request.send())
            .await
            .expect("an answer in time")
            .expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("the body reads");
        self.bodies.lock().unwrap().push(text.clone());
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub(crate) async fn get(&self, path: &str, token: &str) -> Value {
        let (status, body) = self.call("GET", path, Some(token), None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Every answer body so far, as received.
    pub(crate) fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }

    pub(crate) fn assert_no_sigil(&self) {
        for body in self.bodies.lock().unwrap().iter() {
            assert!(
                !body.contains(SIGIL),
                "an API answer holds the secret: {body}"
            );
        }
    }
}

/// One Server-Sent Event as the stream carried it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SseEvent {
    pub(crate) id: i64,
    pub(crate) kind: String,
    pub(crate) data: Value,
}

/// Reads an event stream: events as they are complete, `None` when the stream ends.
pub(crate) struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    pub(crate) async fn open(
        api: &Api,
        run_id: &str,
        token: &str,
        last_event_id: Option<i64>,
    ) -> Self {
        let mut request = api
            .http
            .get(format!("{}/v1/runs/{run_id}/events", api.base))
            .bearer_auth(token)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.expect("the stream opens");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            response,
            buffer: String::new(),
        }
    }

    pub(crate) async fn next(&mut self) -> Option<SseEvent> {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut kind, mut data) = (None, None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().parse().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        kind = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if let (Some(id), Some(kind)) = (id, kind) {
                    let data = serde_json::from_str(&data).expect("the data is JSON");
                    return Some(SseEvent { id, kind, data });
                }
                // A keep-alive comment: nothing to hand out.
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("the stream moves in time")
                .expect("the stream reads");
            match chunk {
                Some(bytes) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                None => return None,
            }
        }
    }
}
