//! The loopback HTTP/1.1 server: one task per connection, answers from a handler.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// The method, as sent.
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// Headers with lowercase names, in order.
    pub headers: Vec<(String, String)>,
    /// The body (by content-length).
    pub body: Vec<u8>,
    /// The head and body as text, exactly as received.
    pub raw: String,
}

impl HttpRequest {
    /// The first value of a header, by lowercase name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the server does with a request.
#[derive(Debug, Clone)]
pub enum HttpReply {
    /// Answer with a status, headers and a body (content-length is added).
    Respond {
        /// The status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// Never answer; report [`Seen::Closed`] when the client goes away.
    Stall,
    /// Reset the connection (RST, no answer) right after reading the request: a server
    /// that died, or a proxy that dropped the call, after the body arrived.
    Reset,
    /// Answer with a chunked body written one chunk per write (an event stream as it is
    /// generated). With `hold_open`, the body never ends: the server waits and reports
    /// [`Seen::Closed`] when the client goes away; without, the body ends cleanly.
    Stream {
        /// The status code.
        status: u16,
        /// The content type.
        content_type: String,
        /// The body's pieces, each sent as one chunk.
        chunks: Vec<Vec<u8>>,
        /// Keep the stream open after the last chunk.
        hold_open: bool,
    },
    /// Wait this long, then answer as the inner reply: a slow server, so that requests
    /// from several clients overlap.
    Delayed(Duration, Box<HttpReply>),
}

impl HttpReply {
    /// A plain-text answer.
    pub fn text(status: u16, body: &str) -> Self {
        Self::Respond {
            status,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    /// An answer with a content type.
    pub fn typed(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self::Respond {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body: body.into(),
        }
    }

    /// A JSON answer (`application/json`).
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Self::typed(status, "application/json", body.to_string())
    }

    /// A `text/event-stream` answer sent in `chunks`; see [`HttpReply::Stream`].
    pub fn event_stream(chunks: Vec<Vec<u8>>, hold_open: bool) -> Self {
        Self::Stream {
            status: 200,
            content_type: "text/event-stream".into(),
            chunks,
            hold_open,
        }
    }

    /// Adds a header to a `Respond`.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let Self::Respond { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }
}

/// A port on 127.0.0.1 that nothing listens on (it was bound once and released), for a
/// call that must be refused at connect.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

/// Something the server saw, with the instant it saw it.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A connection was accepted.
    Connected(Instant),
    /// A full request arrived.
    Request(Instant, HttpRequest),
    /// The client closed a connection whose request was stalled or whose stream was held
    /// open.
    Closed(Instant),
}

type Handler = Arc<dyn Fn(&HttpRequest) -> HttpReply + Send + Sync>;

/// A running server on 127.0.0.1; it stops when dropped.
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Everything it saw, in order.
    pub events: mpsc::UnboundedReceiver<Seen>,
    /// How many connections it accepted.
    pub connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Starts a server; `handler` answers every request. Ready when this returns.
    pub async fn start(
        handler: impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let (tx, events) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let handler: Handler = Arc::new(handler);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(Seen::Connected(Instant::now()));
                tokio::spawn(serve(stream, handler.clone(), tx.clone()));
            }
        });
        Self {
            addr,
            events,
            connections,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many connections were accepted so far.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The next event, waiting at most `within`; panics on timeout so the test fails.
    pub async fn next(&mut self, within: Duration) -> Seen {
        tokio::time::timeout(within, self.events.recv())
            .await
            .expect("the test server saw nothing in time")
            .expect("the test server stopped")
    }

    /// The next request, skipping other events.
    pub async fn next_request(&mut self, within: Duration) -> HttpRequest {
        loop {
            if let Seen::Request(_, request) = self.next(within).await {
                return request;
            }
        }
    }

    /// The instant of the next close of a stalled request, skipping other events.
    pub async fn next_close(&mut self, within: Duration) -> Instant {
        loop {
            if let Seen::Closed(at) = self.next(within).await {
                return at;
            }
        }
    }

    /// Every request seen so far without waiting, in order (other events are dropped).
    pub fn drain_requests(&mut self) -> Vec<HttpRequest> {
        let mut out = Vec::new();
        while let Ok(seen) = self.events.try_recv() {
            if let Seen::Request(_, request) = seen {
                out.push(request);
            }
        }
        out
    }
}

async fn serve(mut stream: TcpStream, handler: Handler, tx: mpsc::UnboundedSender<Seen>) {
    let _ = stream.set_nodelay(true);
    let mut buffer = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buffer).await else {
            return;
        };
        let mut reply = handler(&request);
        let _ = tx.send(Seen::Request(Instant::now(), request));
        while let HttpReply::Delayed(delay, inner) = reply {
            tokio::time::sleep(delay).await;
            reply = *inner;
        }
        match reply {
            HttpReply::Stall => {
                let mut byte = [0u8; 1];
                loop {
                    match stream.read(&mut byte).await {
                        Ok(0) | Err(_) => {
                            let _ = tx.send(Seen::Closed(Instant::now()));
                            return;
                        }
                        Ok(_) => continue,
                    }
                }
            }
            HttpReply::Stream {
                status,
                content_type,
                chunks,
                hold_open,
            } => {
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
                );
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for chunk in chunks.iter().filter(|c| !c.is_empty()) {
                    let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                    framed.extend_from_slice(chunk);
                    framed.extend_from_slice(b"\r\n");
                    if stream.write_all(&framed).await.is_err() {
                        return;
                    }
                }
                if hold_open {
                    let mut byte = [0u8; 1];
                    loop {
                        match stream.read(&mut byte).await {
                            Ok(0) | Err(_) => {
                                let _ = tx.send(Seen::Closed(Instant::now()));
                                return;
                            }
                            Ok(_) => continue,
                        }
                    }
                }
                if stream.write_all(b"0\r\n\r\n").await.is_err() {
                    return;
                }
            }
            // Unwrapped above.
            HttpReply::Delayed(..) => return,
            HttpReply::Reset => {
                // SO_LINGER 0: closing sends RST instead of FIN.
                let _ = stream.set_zero_linger();
                return;
            }
            HttpReply::Respond {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                // One write: a head and body in two small writes meet Nagle and delayed
                // ACKs and add ~40 ms, which would distort every benchmark on this server.
                let mut message = head.into_bytes();
                message.extend_from_slice(&body);
                if stream.write_all(&message).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads one request (head plus a content-length body); `None` when the peer closed first.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<HttpRequest> {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            let mut lines = head.split("\r\n");
            let mut first = lines.next().unwrap_or_default().split(' ');
            let (method, target) = (
                first.next().unwrap_or_default().to_string(),
                first.next().unwrap_or_default().to_string(),
            );
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            let length = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let body = buffer[end + 4..end + 4 + length].to_vec();
                let raw = String::from_utf8_lossy(&buffer[..end + 4 + length]).to_string();
                buffer.drain(..end + 4 + length);
                return Some(HttpRequest {
                    method,
                    target,
                    headers,
                    body,
                    raw,
                });
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}
