//! The target's answer to a forwarded request, its head rewritten to say
//! `Connection: close`, so that the client never sends a second request down a connection
//! the proxy has already tied to the first request's target.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::head::MAX_HEAD;

/// Where the rewrite is.
enum State {
    /// Reading an answer's head; what came so far.
    Head(Vec<u8>),
    /// Handing out a head (rewritten, or an interim one as it came) from `at`; then the
    /// next head, from what followed this one, or, with `None`, everything as it comes.
    Out {
        bytes: Vec<u8>,
        at: usize,
        next: Option<Vec<u8>>,
    },
    /// Everything after the final head passes as it comes.
    Through,
}

/// A stream to the target whose reads give the answer with its head rewritten; writes pass.
pub(super) struct ClosingAnswer<S> {
    inner: S,
    state: State,
}

impl<S> ClosingAnswer<S> {
    pub(super) fn new(inner: S) -> Self {
        Self {
            inner,
            state: State::Head(Vec::new()),
        }
    }
}

/// What to hand out for the head buffer `pending`, and what follows (`None`: the rest
/// passes through); `None` while the head is incomplete and within bounds.
fn judge(pending: &mut Vec<u8>) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut answer = httparse::Response::new(&mut fields);
    match answer.parse(pending) {
        Ok(httparse::Status::Complete(len)) => {
            if answer.code.is_some_and(|code| (100..200).contains(&code)) {
                // An interim answer (100 Continue) passes as it came; a final head follows.
                let rest = pending.split_off(len);
                return Some((std::mem::take(pending), Some(rest)));
            }
            let mut bytes = closing_head(pending, &answer);
            bytes.extend_from_slice(&pending[len..]);
            Some((bytes, None))
        }
        // Not yet whole, and still within bounds: read on.
        Ok(httparse::Status::Partial) if pending.len() < MAX_HEAD => None,
        // Too long or not HTTP: passed through as it came, untouched.
        _ => Some((std::mem::take(pending), None)),
    }
}

/// The head with the status line as sent, the fields but `Connection`, `Keep-Alive`,
/// `Proxy-Connection` and those `Connection` names, and `Connection: close`.
fn closing_head(raw: &[u8], answer: &httparse::Response<'_, '_>) -> Vec<u8> {
    let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap_or(0) + 2;
    let named: Vec<String> = answer
        .headers
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("connection"))
        .flat_map(|f| {
            String::from_utf8_lossy(f.value)
                .split(',')
                .map(|token| token.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut head = raw[..line_end].to_vec();
    for field in answer.headers.iter() {
        let name = field.name.to_ascii_lowercase();
        let hop = matches!(
            name.as_str(),
            "connection" | "keep-alive" | "proxy-connection"
        );
        if hop || named.contains(&name) {
            continue;
        }
        head.extend_from_slice(field.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(field.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head
}

impl<S: AsyncRead + Unpin> AsyncRead for ClosingAnswer<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Through => return Pin::new(&mut this.inner).poll_read(cx, buf),
                State::Out { bytes, at, next } => {
                    let n = (bytes.len() - *at).min(buf.remaining());
                    buf.put_slice(&bytes[*at..*at + n]);
                    *at += n;
                    if *at == bytes.len() {
                        this.state = match next.take() {
                            Some(rest) => State::Head(rest),
                            None => State::Through,
                        };
                    }
                    return Poll::Ready(Ok(()));
                }
                State::Head(pending) => {
                    if !pending.is_empty()
                        && let Some((bytes, next)) = judge(pending)
                    {
                        this.state = State::Out { bytes, at: 0, next };
                        continue;
                    }
                    let mut chunk = [0u8; 4096];
                    let mut read = ReadBuf::new(&mut chunk);
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
                    if read.filled().is_empty() {
                        // The target ended before a whole head: what came passes as it is.
                        let bytes = std::mem::take(pending);
                        this.state = match bytes.is_empty() {
                            true => State::Through,
                            false => State::Out {
                                bytes,
                                at: 0,
                                next: None,
                            },
                        };
                        continue;
                    }
                    pending.extend_from_slice(read.filled());
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ClosingAnswer<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn through(parts: &[&str]) -> String {
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        for part in parts {
            far.write_all(part.as_bytes()).await.unwrap();
        }
        drop(far);
        let mut out = String::new();
        ClosingAnswer::new(near)
            .read_to_string(&mut out)
            .await
            .unwrap();
        out
    }

    #[tokio::test]
    async fn the_final_head_says_close_and_the_body_passes_as_it_came() {
        let out = through(&[
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\n",
            "X-Hop: 1\r\nContent-Length: 4\r\n\r\nbody",
        ])
        .await;
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
        );
    }

    #[tokio::test]
    async fn an_interim_head_passes_and_the_final_one_after_it_is_rewritten() {
        let out = through(&["HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"]).await;
        assert_eq!(
            out,
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn what_is_not_an_http_answer_passes_untouched() {
        assert_eq!(
            through(&["SSH-2.0-x\r\n\r\nrest"]).await,
            "SSH-2.0-x\r\n\r\nrest"
        );
        assert_eq!(through(&["HTTP/1.1 200 O"]).await, "HTTP/1.1 200 O");
        assert_eq!(through(&[]).await, "");
    }
}
