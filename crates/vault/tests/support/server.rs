//! A real HTTP/1.1 server on 127.0.0.1 for tests and benchmarks: it records every request
//! as raw text and reports connections, requests and closes as timestamped events.

#![allow(dead_code, unreachable_pub)] // Each test binary uses a different part of it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the server does with each request.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Answer with this status, headers and body.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Read the request, then never answer; report when the client closes.
    Stall,
}

impl Behaviour {
    /// A 200 with a small text body.
    pub fn ok() -> Self {
        Self::Respond {
            status: 200,
            headers: vec![],
            body: b"ok".to_vec(),
        }
    }
}

/// Something the server saw, with the instant it saw it.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A connection was accepted.
    Connected(Instant),
    /// A full request arrived (head and body as text).
    Request(Instant, String),
    /// The client closed a connection that had an unanswered request on it.
    Closed(Instant),
}

/// A running server; it stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub events: mpsc::UnboundedReceiver<Seen>,
    pub connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Starts a server with one behaviour for every request.
    pub async fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let (tx, events) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(Seen::Connected(Instant::now()));
                tokio::spawn(serve(stream, behaviour.clone(), tx.clone()));
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

    /// The next request's raw text, waiting at most `within`.
    pub async fn next_request(&mut self, within: Duration) -> String {
        loop {
            match self.next(within).await {
                Seen::Request(_, text) => return text,
                _ => continue,
            }
        }
    }

    /// The instant of the next close, waiting at most `within`.
    pub async fn next_close(&mut self, within: Duration) -> Instant {
        loop {
            match self.next(within).await {
                Seen::Closed(at) => return at,
                _ => continue,
            }
        }
    }

    /// The next event, waiting at most `within`; panics on timeout so a test fails.
    pub async fn next(&mut self, within: Duration) -> Seen {
        tokio::time::timeout(within, self.events.recv())
            .await
            .expect("the test server saw nothing in time")
            .expect("the test server stopped")
    }
}

async fn serve(mut stream: TcpStream, behaviour: Behaviour, tx: mpsc::UnboundedSender<Seen>) {
    let mut buffer = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buffer).await else {
            return;
        };
        let _ = tx.send(Seen::Request(Instant::now(), request));
        match &behaviour {
            Behaviour::Stall => {
                // Wait for the client to go away; any read result means it did.
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
            Behaviour::Respond {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                if stream.write_all(head.as_bytes()).await.is_err()
                    || stream.write_all(body).await.is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Reads one request (head plus a content-length body); None when the peer closed first.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = find(buffer, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let request = String::from_utf8_lossy(&buffer[..end + 4 + length]).to_string();
                buffer.drain(..end + 4 + length);
                return Some(request);
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
