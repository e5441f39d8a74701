//! The proxy's side of a connection to a target, counting the bytes each way and keeping
//! the first bytes the target sent (where a plain HTTP answer's status line is).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many of the target's first bytes are kept: enough for `HTTP/1.1 200`.
const KEPT: usize = 16;

/// A stream to a target that counts what passes.
pub(super) struct Counted<S> {
    inner: S,
    /// Bytes written to the target.
    pub(super) sent: u64,
    /// Bytes read from the target.
    pub(super) received: u64,
    first: Vec<u8>,
}

impl<S> Counted<S> {
    pub(super) fn new(inner: S) -> Self {
        Self {
            inner,
            sent: 0,
            received: 0,
            first: Vec::with_capacity(KEPT),
        }
    }

    /// The status of the HTTP/1 answer the target began with, if it began with one.
    pub(super) fn answered_status(&self) -> Option<u16> {
        let text = std::str::from_utf8(self.first.get(..12)?).ok()?;
        let rest = text.strip_prefix("HTTP/1.")?;
        let (_, status) = rest.split_once(' ')?;
        status.parse().ok().filter(|s| (100..600).contains(s))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let new = &buf.filled()[before..];
        let room = KEPT - self.first.len().min(KEPT);
        let kept = &new[..new.len().min(room)];
        let count = new.len() as u64;
        self.first.extend_from_slice(kept);
        self.received += count;
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.sent += n as u64;
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `4312` as `4,312`: how the rows write byte counts.
pub(super) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        let cases = [
            (0, "0"),
            (517, "517"),
            (4312, "4,312"),
            (100_000, "100,000"),
            (1_234_567, "1,234,567"),
        ];
        for (n, text) in cases {
            assert_eq!(grouped(n), text);
        }
    }

    #[tokio::test]
    async fn both_directions_are_counted_and_the_status_line_is_read() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut counted = Counted::new(near);
        counted.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        far.write_all(b"HTTP/1.1 404 Not Found\r\n").await.unwrap();
        let mut buf = [0u8; 5];
        counted.read_exact(&mut buf).await.unwrap();
        assert_eq!(counted.answered_status(), None, "five bytes say no status");
        let mut rest = [0u8; 19];
        counted.read_exact(&mut rest).await.unwrap();
        assert_eq!((counted.sent, counted.received), (18, 24));
        assert_eq!(counted.answered_status(), Some(404));
    }
}
