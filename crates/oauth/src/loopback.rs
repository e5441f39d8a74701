//! The loopback redirect of an operator's authorization (RFC 8252 §7.3): a listener on
//! 127.0.0.1 at a random port that takes one `GET /callback?...` and answers a short page.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use runwarden_vault::CancellationSignal;

/// The longest request head the listener reads.
const MAX_HEAD: usize = 16 * 1024;

/// A bound redirect listener.
pub(crate) struct Loopback {
    listener: TcpListener,
    port: u16,
}

/// Why no callback arrived.
#[derive(Debug)]
pub(crate) enum Wait {
    TimedOut,
    Cancelled,
    Io(std::io::Error),
}

impl Loopback {
    /// Binds 127.0.0.1 on a port the system picks.
    pub(crate) async fn bind() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        Ok(Self { listener, port })
    }

    /// `http://127.0.0.1:PORT/callback`.
    pub(crate) fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    /// Waits for the browser's `GET /callback?...` and answers it; other paths get a 404
    /// and the wait goes on. Answers the query's pairs.
    pub(crate) async fn wait(
        &self,
        limit: Duration,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Vec<(String, String)>, Wait> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted.map_err(Wait::Io)?,
                _ = tokio::time::sleep_until(deadline) => return Err(Wait::TimedOut),
                _ = tick.tick() => {
                    if signal.is_some_and(|s| s.is_cancelled()) {
                        return Err(Wait::Cancelled);
                    }
                    continue;
                }
            };
            let (mut stream, _) = accepted;
            let mut head = Vec::new();
            let mut buf = [0u8; 2048];
            let read = tokio::time::timeout(Duration::from_secs(10), async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                continue;
            }
            let line = String::from_utf8_lossy(&head);
            let target = line
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("GET "))
                .and_then(|l| l.split(' ').next())
                .unwrap_or("");
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            if path != "/callback" {
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await;
                continue;
            }
            let body =
                "runwarden: the authorization response arrived; you may close this window.\n";
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\ncache-control: no-store\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
            return Ok(url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect());
        }
    }
}
