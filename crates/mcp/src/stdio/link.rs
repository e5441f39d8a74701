//! The JSON-RPC link to a local server: one message per line on its stdin and stdout.
//! Our requests wait for their answers by id; what the server sends besides them goes to
//! the call it belongs to (progress by its token, its own requests to the oldest open
//! call) or, with no call to take it, is answered here (`ping`) or logged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use runwarden_vault::Redactor;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

/// The server's stdin, as the sandbox hands it over.
pub(crate) type Input = Box<dyn AsyncWrite + Send + Unpin>;

/// The server's stdout or stderr, as the sandbox hands it over.
pub(crate) type Output = Box<dyn AsyncRead + Send + Unpin>;

/// The longest stderr line logged whole; the rest of a longer one is cut.
const STDERR_LINE: usize = 4096;

/// What a request of ours gets from the server: its answer, and everything else that
/// belongs to it while it is open (progress, log lines, the server's own requests).
struct Waiter {
    answer: Option<oneshot::Sender<Value>>,
    events: mpsc::UnboundedSender<Value>,
}

/// One request of ours waiting for its answer; dropping it stops the wait.
pub(crate) struct Pending {
    id: i64,
    link: Arc<Link>,
    pub(crate) answer: oneshot::Receiver<Value>,
    pub(crate) events: mpsc::UnboundedReceiver<Value>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.link.lock_waiters().remove(&self.id);
    }
}

/// Why a message could not be written to the server's stdin.
#[derive(Debug)]
pub(crate) struct WriteFailed {
    /// True when part of the message may have reached the server.
    pub(crate) partly: bool,
    pub(crate) detail: String,
}

/// The link to one running local server.
pub(crate) struct Link {
    server: String,
    stdin: tokio::sync::Mutex<Option<Input>>,
    waiters: Mutex<BTreeMap<i64, Waiter>>,
    /// Calls given up on, waiting to learn whether the server still answers them.
    late: Mutex<BTreeMap<i64, oneshot::Sender<()>>>,
    /// Set once the server's stdout ends: why, in words a person reads.
    ended: watch::Sender<Option<String>>,
    redactor: Redactor,
}

impl Link {
    /// A link over the child's pipes; its reader and its stderr logger run until the
    /// pipes close. `max_line` bounds one message (the server's `max_response_bytes`).
    pub(crate) fn start(
        server: &str,
        stdin: Input,
        stdout: Output,
        stderr: Output,
        max_line: usize,
        redactor: Redactor,
    ) -> Arc<Self> {
        let (ended, _) = watch::channel(None);
        let link = Arc::new(Self {
            server: server.to_string(),
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            waiters: Mutex::default(),
            late: Mutex::default(),
            ended,
            redactor,
        });
        tokio::spawn(read_stdout(link.clone(), BufReader::new(stdout), max_line));
        tokio::spawn(log_stderr(
            link.server.clone(),
            BufReader::new(stderr),
            link.redactor.clone(),
        ));
        link
    }

    fn lock_waiters(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Waiter>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the answer to request `id`; call before the request is written, so an
    /// answer that comes at once is not missed.
    pub(crate) fn expect(self: &Arc<Self>, id: i64) -> Pending {
        let (answer_tx, answer) = oneshot::channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        self.lock_waiters().insert(
            id,
            Waiter {
                answer: Some(answer_tx),
                events: events_tx,
            },
        );
        Pending {
            id,
            link: self.clone(),
            answer,
            events,
        }
    }

    /// Resolves when the server answers request `id`, given up on by its caller, or its
    /// stdout ends; resolves false at once when it can no longer answer.
    pub(crate) fn answered_late(&self, id: i64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        if self.ended.borrow().is_none() {
            self.late
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, tx);
        }
        rx
    }

    /// Writes one message and its newline. Secrets are the caller's concern: the message
    /// was checked before it got here.
    pub(crate) async fn write(&self, message: &Value) -> Result<(), WriteFailed> {
        let mut line = serde_json::to_vec(message).expect("JSON values always serialize");
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(WriteFailed {
                partly: false,
                detail: "its stdin is closed".into(),
            });
        };
        // A short write leaves part of the line in the pipe: the server may have read it.
        let written = pipe.write(&line).await;
        let rest = match written {
            Ok(n) if n == line.len() => return flush(pipe).await,
            Ok(n) => n,
            Err(error) => {
                return Err(WriteFailed {
                    partly: false,
                    detail: error.to_string(),
                });
            }
        };
        match pipe.write_all(&line[rest..]).await {
            Ok(()) => flush(pipe).await,
            Err(error) => Err(WriteFailed {
                partly: true,
                detail: error.to_string(),
            }),
        }
    }

    /// Closes the server's stdin: the polite way to ask it to stop.
    pub(crate) async fn close_stdin(&self) {
        if let Some(mut pipe) = self.stdin.lock().await.take() {
            let _ = pipe.shutdown().await;
        }
    }

    /// Routes one message the server sent.
    fn deliver(self: &Arc<Self>, mut message: Value) {
        // Whatever the server sends is scrubbed of every stored secret, decoded, before
        // any caller (a model, an event, a log) sees it.
        self.redactor.value(&mut message);
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = message.get("id").filter(|id| !id.is_null()).cloned();
        match (method.as_deref(), id.as_ref()) {
            (None, Some(id)) => self.answer(id, message),
            (Some("ping"), Some(id)) => {
                let pong = json!({"jsonrpc": "2.0", "id": id, "result": {}});
                self.reply(pong);
            }
            (Some(method), Some(id)) => {
                // Its own request: the oldest open call answers it (an elicitation during
                // a call); with none open, it is refused.
                let oldest = self
                    .lock_waiters()
                    .values()
                    .next()
                    .map(|w| w.events.clone());
                match oldest {
                    Some(events) => {
                        let _ = events.send(message);
                    }
                    None => self.reply(json!({"jsonrpc": "2.0", "id": id, "error": {
                        "code": -32601,
                        "message": format!("runwarden has no call open to answer {method}"),
                    }})),
                }
            }
            (Some(method), None) => self.notification(method, message),
            (None, None) => {
                tracing::debug!(server = %self.server, "skipped a message that is neither a request, an answer nor a notification");
            }
        }
    }

    fn answer(&self, id: &Value, message: Value) {
        let Some(id) = id
            .as_i64()
            .or_else(|| id.as_str().and_then(|s| s.parse().ok()))
        else {
            return;
        };
        if let Some(late) = self
            .late
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
        {
            let _ = late.send(());
        }
        let answer = self
            .lock_waiters()
            .get_mut(&id)
            .and_then(|w| w.answer.take());
        if let Some(answer) = answer {
            let _ = answer.send(message);
        }
    }

    fn notification(&self, method: &str, message: Value) {
        let params = message.get("params");
        let token = params.and_then(|p| p.get("progressToken"));
        let token = token.and_then(|t| t.as_i64().or_else(|| t.as_str()?.parse().ok()));
        let waiters = self.lock_waiters();
        let to = match token {
            Some(token) => waiters.get(&token),
            // A log line goes to the call when only one is open; it is logged either way.
            None if waiters.len() == 1 => waiters.values().next(),
            None => None,
        };
        if let Some(waiter) = to {
            let _ = waiter.events.send(message.clone());
        }
        drop(waiters);
        if method == "notifications/message" {
            let data = params.and_then(|p| p.get("data")).cloned();
            tracing::info!(server = %self.server, data = %data.unwrap_or_default(), "the server logged");
        }
    }

    /// Answers the server from the reader itself, without waiting on it.
    fn reply(self: &Arc<Self>, message: Value) {
        let link = self.clone();
        tokio::spawn(async move {
            if let Err(error) = link.write(&message).await {
                tracing::debug!(server = %link.server, detail = %error.detail, "could not answer the server");
            }
        });
    }

    fn end(&self, reason: String) {
        self.ended.send_replace(Some(reason));
        self.late.lock().unwrap_or_else(|p| p.into_inner()).clear();
        // Every open call learns at once: its answer will never come.
        for waiter in self.lock_waiters().values_mut() {
            waiter.answer.take();
        }
    }
}

async fn flush(pipe: &mut Input) -> Result<(), WriteFailed> {
    pipe.flush().await.map_err(|error| WriteFailed {
        partly: true,
        detail: error.to_string(),
    })
}

/// Reads the server's stdout, one message per line, until it ends.
async fn read_stdout(link: Arc<Link>, mut stdout: BufReader<Output>, max_line: usize) {
    let mut line = Vec::new();
    let reason = loop {
        line.clear();
        match read_line_capped(&mut stdout, &mut line, max_line).await {
            Ok(Line::End) => break "its stdout closed".to_string(),
            Ok(Line::TooLong) => {
                tracing::warn!(server = %link.server, max_line, "the server wrote a message over max_response_bytes; it was skipped");
            }
            Ok(Line::Read) => match serde_json::from_slice::<Value>(&line) {
                Ok(message) => link.deliver(message),
                Err(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = link.redactor.text(&text);
                    tracing::warn!(server = %link.server, line = %cut(&text), "the server wrote a line on stdout that is not JSON-RPC; it was skipped");
                }
            },
            Err(error) => break format!("reading its stdout failed: {error}"),
        }
    };
    link.end(reason);
}

enum Line {
    Read,
    TooLong,
    End,
}

/// One line into `line` (without its newline), read whole only up to `cap` bytes: a
/// longer one is consumed and dropped.
async fn read_line_capped<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<Line> {
    let mut too_long = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if line.is_empty() && !too_long {
                Line::End
            } else if too_long {
                Line::TooLong
            } else {
                Line::Read
            });
        }
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (&buf[..at], Some(at + 1)),
            None => (buf, None),
        };
        if !too_long && line.len() + chunk.len() <= cap {
            line.extend_from_slice(chunk);
        } else {
            too_long = true;
            line.clear();
        }
        let used = done.unwrap_or(buf.len());
        reader.consume(used);
        if done.is_some() {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.is_empty() && !too_long {
                continue;
            }
            return Ok(if too_long { Line::TooLong } else { Line::Read });
        }
    }
}

/// Logs the server's stderr line by line with its name, each line scrubbed.
async fn log_stderr(server: String, mut stderr: BufReader<Output>, redactor: Redactor) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line_capped(&mut stderr, &mut line, STDERR_LINE).await {
            Ok(Line::End) | Err(_) => return,
            Ok(Line::TooLong) => {
                tracing::info!(target: "runwarden::mcp::stderr", server = %server, "(a line over 4 KiB was skipped)");
            }
            Ok(Line::Read) => {
                let text = String::from_utf8_lossy(&line);
                let text = redactor.text(&text);
                tracing::info!(target: "runwarden::mcp::stderr", server = %server, "{}", text);
            }
        }
    }
}

fn cut(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_read_whole_up_to_the_cap_and_longer_ones_dropped() {
        let input: &[u8] = b"{\"a\":1}\r\n\n0123456789abcdef\nok";
        let mut reader = BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        let mut seen = Vec::new();
        loop {
            line.clear();
            match read_line_capped(&mut reader, &mut line, 10).await.unwrap() {
                Line::End => break,
                Line::TooLong => seen.push("too long".to_string()),
                Line::Read => seen.push(String::from_utf8(line.clone()).unwrap()),
            }
        }
        assert_eq!(seen, ["{\"a\":1}", "too long", "ok"]);
    }
}
