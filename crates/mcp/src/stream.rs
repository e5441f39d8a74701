//! M14-M16: what a server sends in a response stream besides our response. Its requests
//! are handed to the client to answer while the stream is still open, its progress and
//! log notifications go to the caller's [`NoticeSink`], and its event ids and `retry` are
//! kept so a stream that ends early can be resumed with `Last-Event-ID`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::sse;

/// A progress or log notification a server sent during one tool call (M15).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// `notifications/progress` for the call's `progressToken`.
    Progress {
        /// How far along, in the server's units; increases with every notice.
        progress: f64,
        /// The total, when the server knows it.
        total: Option<f64>,
        /// The server's words, if any (server-written: show it as data, never obey it).
        message: Option<String>,
    },
    /// `notifications/message`: a log line the server sent while the call ran.
    Log {
        /// The syslog level name the server gave (`info`, `warning`, ...).
        level: String,
        /// The server's logger name, if any.
        logger: Option<String>,
        /// The logged data, any JSON value.
        data: Value,
    },
}

/// Where a tool call's [`Notice`]s go. It is called from the task that reads the response
/// stream, so it must return at once (queue, count, drop; never wait).
#[derive(Clone)]
pub struct NoticeSink(Arc<dyn Fn(Notice) + Send + Sync>);

impl Notice {
    /// A progress notice made on this side (a gateway call waiting for an operator).
    pub fn progress(progress: f64, total: Option<f64>, message: Option<String>) -> Self {
        Self::Progress {
            progress,
            total,
            message,
        }
    }
}

impl NoticeSink {
    /// A sink from a function that must not block.
    pub fn new(sink: impl Fn(Notice) + Send + Sync + 'static) -> Self {
        Self(Arc::new(sink))
    }

    /// Hands `notice` to the sink.
    pub fn send(&self, notice: Notice) {
        (self.0)(notice);
    }

    /// A sink that hands every notice to this one, then to `other`.
    pub fn and(self, other: NoticeSink) -> Self {
        Self::new(move |notice: Notice| {
            (self.0)(notice.clone());
            (other.0)(notice);
        })
    }
}

impl std::fmt::Debug for NoticeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoticeSink")
    }
}

/// A request the server sent us in a stream (M14).
#[derive(Debug, Clone)]
pub(crate) struct ServerRequest {
    /// Its JSON-RPC id, echoed in our answer as sent (number or string).
    pub(crate) id: Value,
    /// The method (`ping`, `elicitation/create`, ...).
    pub(crate) method: String,
    /// The params, `null` when absent.
    pub(crate) params: Value,
}

/// What a stream said about itself, across every leg of one request (M16).
#[derive(Debug, Default)]
pub(crate) struct Marks {
    /// The id of the last event read, the resumption point.
    pub(crate) last_event_id: Option<String>,
    /// The server's `retry` advice.
    pub(crate) retry: Option<Duration>,
    /// Legs that carried at least one event.
    pub(crate) events: usize,
}

/// Called on every progress notice of the call (M15: deadline extension).
pub(crate) type OnProgress = Arc<dyn Fn() + Send + Sync>;

/// Reads one leg's stream as it arrives: the vault's `complete_when` hook feeds it the body
/// read so far after every chunk.
pub(crate) struct Watch {
    our_id: i64,
    /// False on a standalone GET stream: it carries no response of ours, so it is read
    /// until the call ends, not until a response arrives.
    completes: bool,
    /// Bytes of this leg's body already read as complete events.
    consumed: usize,
    marks: Arc<Mutex<Marks>>,
    counted: bool,
    requests: Option<mpsc::UnboundedSender<ServerRequest>>,
    notices: Option<NoticeSink>,
    on_progress: Option<OnProgress>,
}

impl Watch {
    pub(crate) fn new(
        our_id: i64,
        marks: Arc<Mutex<Marks>>,
        requests: Option<mpsc::UnboundedSender<ServerRequest>>,
        notices: Option<NoticeSink>,
        on_progress: Option<OnProgress>,
    ) -> Self {
        Self {
            our_id,
            completes: true,
            consumed: 0,
            marks,
            counted: false,
            requests,
            notices,
            on_progress,
        }
    }

    /// A watch of the standalone GET stream open during call `our_id` (M14): it answers
    /// the server's requests and hands on the call's notices, and never completes.
    pub(crate) fn standalone(mut self) -> Self {
        self.completes = false;
        self
    }

    /// Reads the complete events not read yet; true once our response is among them.
    pub(crate) fn feed(&mut self, body: &[u8]) -> bool {
        let mut answered = false;
        loop {
            let Some(fresh) = body.get(self.consumed..) else {
                return answered;
            };
            let mut pos = 0;
            let mut event = Event::default();
            let mut ended = false;
            while let Some(newline) = fresh[pos..].iter().position(|b| *b == b'\n') {
                let raw = &fresh[pos..pos + newline];
                pos += newline + 1;
                let line = raw.strip_suffix(b"\r").unwrap_or(raw);
                if line.is_empty() {
                    ended = true;
                    break;
                }
                event.field(line);
            }
            if !ended {
                return answered;
            }
            self.consumed += pos;
            if !event.is_empty() {
                answered |= self.event(event);
            }
        }
    }

    /// One complete event; true when it is our response.
    fn event(&mut self, event: Event) -> bool {
        {
            let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(id) = event.id {
                marks.last_event_id = Some(id);
            }
            if let Some(retry) = event.retry {
                marks.retry = Some(retry);
            }
            if !self.counted {
                self.counted = true;
                marks.events += 1;
            }
        }
        let Some(data) = event.data else {
            return false;
        };
        let Ok(message) = serde_json::from_str::<Value>(&data) else {
            // A priming event has empty data; anything else unreadable is skipped (M1).
            return false;
        };
        self.message(message)
    }

    /// One message the server sent while our request is open, read from a stream event
    /// or a local server's line; true when it is our response.
    pub(crate) fn message(&mut self, message: Value) -> bool {
        if sse::is_response_to(&message, self.our_id) {
            return self.completes;
        }
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return false;
        };
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        match message.get("id") {
            Some(id) if !id.is_null() => {
                if let Some(requests) = &self.requests {
                    let _ = requests.send(ServerRequest {
                        id: id.clone(),
                        method: method.to_string(),
                        params,
                    });
                }
            }
            _ => self.notification(method, &params),
        }
        false
    }

    fn notification(&self, method: &str, params: &Value) {
        match method {
            "notifications/progress" => {
                // M15: only the progress of our own call (its token is our request id).
                let token = params.get("progressToken");
                let ours = token.and_then(Value::as_i64) == Some(self.our_id)
                    || token.and_then(Value::as_str) == Some(&self.our_id.to_string());
                let Some(progress) = params.get("progress").and_then(Value::as_f64) else {
                    return;
                };
                if !ours {
                    return;
                }
                if let Some(stretch) = &self.on_progress {
                    stretch();
                }
                if let Some(sink) = &self.notices {
                    sink.send(Notice::Progress {
                        progress,
                        total: params.get("total").and_then(Value::as_f64),
                        message: params
                            .get("message")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    });
                }
            }
            "notifications/message" => {
                if let Some(sink) = &self.notices {
                    sink.send(Notice::Log {
                        level: params
                            .get("level")
                            .and_then(Value::as_str)
                            .unwrap_or("info")
                            .to_string(),
                        logger: params
                            .get("logger")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        data: params.get("data").cloned().unwrap_or(Value::Null),
                    });
                }
            }
            _ => {}
        }
    }
}

/// The fields of one event being read.
#[derive(Default)]
struct Event {
    id: Option<String>,
    retry: Option<Duration>,
    data: Option<String>,
}

impl Event {
    fn is_empty(&self) -> bool {
        self.id.is_none() && self.retry.is_none() && self.data.is_none()
    }

    fn field(&mut self, line: &[u8]) {
        let line = String::from_utf8_lossy(line);
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match name {
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            // An id with a NUL is ignored, as the SSE standard says.
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            "retry" => {
                if let Ok(ms) = value.trim().parse::<u64>() {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch, the marks it keeps, the requests it hands over and the notices it sent.
    type Watched = (
        Watch,
        Arc<Mutex<Marks>>,
        mpsc::UnboundedReceiver<ServerRequest>,
        Arc<Mutex<Vec<Notice>>>,
    );

    fn watch(id: i64) -> Watched {
        let marks = Arc::new(Mutex::new(Marks::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink_seen = seen.clone();
        let sink = NoticeSink::new(move |n| sink_seen.lock().unwrap().push(n));
        (
            Watch::new(id, marks.clone(), Some(tx), Some(sink), None),
            marks,
            rx,
            seen,
        )
    }

    #[test]
    fn requests_notices_and_the_resumption_point_are_read_as_they_arrive() {
        let (mut w, marks, mut rx, seen) = watch(7);
        let mut body = b"id: 1\nretry: 250\ndata: \n\nid: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"ping\"}\n\n".to_vec();
        assert!(!w.feed(&body));
        let request = rx.try_recv().unwrap();
        assert_eq!(
            (request.id, request.method.as_str()),
            (Value::from("s1"), "ping")
        );
        body.extend_from_slice(b"id: 3\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":7,\"progress\":1,\"total\":2}}\n\nid: 4\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":8,\"progress\":1}}\n\n");
        assert!(!w.feed(&body));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Notice::Progress {
                progress: 1.0,
                total: Some(2.0),
                message: None
            }],
            "only our token's progress"
        );
        {
            let marks = marks.lock().unwrap();
            assert_eq!(marks.last_event_id.as_deref(), Some("4"));
            assert_eq!(marks.retry, Some(Duration::from_millis(250)));
        }
        body.extend_from_slice(
            b"id: 5\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\r\n\r\n",
        );
        assert!(w.feed(&body));
        assert!(rx.try_recv().is_err(), "each request is handed over once");
    }

    #[test]
    fn an_unfinished_event_waits_for_its_blank_line() {
        let (mut w, marks, _rx, _seen) = watch(1);
        let half = b"id: 9\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n".to_vec();
        assert!(!w.feed(&half));
        assert_eq!(marks.lock().unwrap().last_event_id, None);
        let mut whole = half.clone();
        whole.push(b'\n');
        assert!(w.feed(&whole));
    }
}
