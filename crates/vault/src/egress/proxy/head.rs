//! The head of a proxied request: read within its bounds, parsed, and, for a plain HTTP
//! request, written again in origin form for the target.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};

/// The most a request head may take (V10).
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// How long the whole head may take to arrive (V10).
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// The most header fields a head may have.
const MAX_FIELDS: usize = 100;

/// What the proxy says to every request it cannot serve, before the reason.
const TAKES: &str =
    "runwarden's proxy takes CONNECT host:port or a request for an absolute http:// URL";

/// What a client asked the proxy for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ask {
    /// `CONNECT host:port`: a tunnel. The host has no brackets.
    Tunnel {
        /// The host as written, without brackets.
        host: String,
        /// The port.
        port: u16,
    },
    /// A plain HTTP request in absolute form, to be forwarded.
    Forward(Forward),
}

/// A plain HTTP request to forward: its line and fields as the client sent them.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Forward {
    /// The method, as sent.
    pub(super) method: String,
    /// The absolute `http://` URL, as sent.
    pub(super) url: String,
    /// The minor HTTP version (HTTP/1.0 or HTTP/1.1).
    pub(super) minor: u8,
    /// The header fields, in order.
    pub(super) fields: Vec<(String, Vec<u8>)>,
}

/// A head that was read: what it asks for, and what the client sent after it.
#[derive(Debug)]
pub(super) struct Head {
    /// What the client asked for.
    pub(super) ask: Ask,
    /// Bytes that came after the head: the start of a body, or of a tunnel's stream.
    pub(super) rest: Vec<u8>,
}

/// Why no head was read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeadError {
    /// The client closed the connection or it failed; there is no one to answer.
    Gone,
    /// The head cannot be served: the status to answer and one line saying why.
    Rejected {
        /// The status answered.
        status: u16,
        /// One line for the client.
        line: String,
    },
}

fn rejected(status: u16, line: impl Into<String>) -> HeadError {
    HeadError::Rejected {
        status,
        line: line.into(),
    }
}

/// Reads one request head from `reader`: at most [`MAX_HEAD`] bytes, within
/// [`HEAD_TIMEOUT`].
pub(super) async fn read_head<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Head, HeadError> {
    match tokio::time::timeout(HEAD_TIMEOUT, read_within_bounds(reader)).await {
        Ok(read) => read,
        Err(_) => Err(rejected(
            408,
            format!(
                "the request head did not arrive within {} s",
                HEAD_TIMEOUT.as_secs()
            ),
        )),
    }
}

async fn read_within_bounds<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Head, HeadError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = reader.read(&mut chunk).await.map_err(|_| HeadError::Gone)?;
        if n == 0 {
            return Err(HeadError::Gone);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((ask, len)) = parse(&buf)? {
            if len > MAX_HEAD {
                return Err(too_large());
            }
            return Ok(Head {
                ask,
                rest: buf.split_off(len),
            });
        }
        if buf.len() >= MAX_HEAD {
            return Err(too_large());
        }
    }
}

fn too_large() -> HeadError {
    rejected(
        431,
        format!("the request head is over {} KiB", MAX_HEAD / 1024),
    )
}

/// The ask of a complete head in `buf` and the head's length, or `None` while it is partial.
fn parse(buf: &[u8]) -> Result<Option<(Ask, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut request = httparse::Request::new(&mut fields);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(len)) => len,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(rejected(
                431,
                format!("the request head has over {MAX_FIELDS} header fields"),
            ));
        }
        Err(_) => return Err(rejected(400, format!("{TAKES}; this is not HTTP/1"))),
    };
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version)
    else {
        return Err(rejected(400, format!("{TAKES}; this is not HTTP/1")));
    };
    let ask = if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target).ok_or_else(|| {
            rejected(
                400,
                "CONNECT takes host:port, as in CONNECT example.com:443",
            )
        })?;
        Ask::Tunnel { host, port }
    } else {
        let fields = request
            .headers
            .iter()
            .map(|f| (f.name.to_string(), f.value.to_vec()))
            .collect();
        Ask::Forward(Forward {
            method: method.to_string(),
            url: absolute(target)?.to_string(),
            minor,
            fields,
        })
    };
    Ok(Some((ask, len)))
}

/// `host:port` or `[v6]:port`, with a port from 1 to 65535.
fn split_authority(target: &str) -> Option<(String, u16)> {
    let (host, port) = match target.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once("]:")?,
        None => {
            let (host, port) = target.rsplit_once(':')?;
            (!host.contains(':')).then_some((host, port))?
        }
    };
    if host.is_empty()
        || port.is_empty()
        || port.len() > 5
        || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    Some((host.to_string(), port))
}

/// The target of a request to forward: an absolute URL (`scheme://...`), of any scheme
/// so that a refusal can name its target ([`Forward::not_http`]).
fn absolute(target: &str) -> Result<&str, HeadError> {
    let scheme = target.split_once("://").map(|(scheme, _)| scheme);
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"+-.".contains(&b);
    match scheme {
        Some(scheme) if !scheme.is_empty() && scheme.bytes().all(plain) => Ok(target),
        _ if target.starts_with('/') => Err(rejected(400, format!("{TAKES}, not a path alone"))),
        _ => Err(rejected(400, TAKES)),
    }
}

impl Forward {
    /// Why this request is not forwarded, when its URL is not `http://`: one line.
    pub(super) fn not_http(&self) -> Option<&'static str> {
        let (scheme, _) = self.url.split_once("://")?;
        if scheme.eq_ignore_ascii_case("http") {
            None
        } else if scheme.eq_ignore_ascii_case("https") {
            Some("send https through CONNECT host:443, not as an absolute https:// URL")
        } else {
            Some(
                "runwarden's proxy forwards only http:// URLs; use CONNECT host:port for anything else",
            )
        }
    }
}

/// Fields a proxy never forwards: its own and the hop-by-hop ones (RFC 9110 section 7.6.1).
/// `Transfer-Encoding` stays: the body is forwarded as it came, in its framing.
fn is_hop_field(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("proxy-")
        || matches!(
            name.as_str(),
            "connection" | "keep-alive" | "te" | "trailer" | "upgrade" | "host"
        )
}

/// The head sent to the target: the request line in origin form (`path?query` of the
/// vetted `url`), `Host` from the URL (RFC 9112 section 3.2.2), the client's fields but
/// the hop-by-hop ones and those its `Connection` names, and `Connection: close`.
pub(super) fn origin_form(forward: &Forward, url: &url::Url) -> Vec<u8> {
    let named: Vec<String> = forward
        .fields
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, value)| {
            String::from_utf8_lossy(value)
                .split(',')
                .map(|token| token.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut target = url.path().to_string();
    if let Some(query) = url.query() {
        target.push('?');
        target.push_str(query);
    }
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut head = format!(
        "{} {target} HTTP/1.{}\r\nHost: {host}\r\n",
        forward.method, forward.minor
    )
    .into_bytes();
    for (name, value) in &forward.fields {
        if is_hop_field(name) || named.contains(&name.to_ascii_lowercase()) {
            continue;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(text: &str) -> Result<Option<(Ask, usize)>, HeadError> {
        parse(text.as_bytes())
    }

    fn status(result: Result<Option<(Ask, usize)>, HeadError>) -> u16 {
        match result {
            Err(HeadError::Rejected { status, .. }) => status,
            other => panic!("not rejected: {other:?}"),
        }
    }

    #[test]
    fn a_connect_names_its_host_and_port() {
        let text = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nhello";
        let (parsed, len) = ask(text).unwrap().unwrap();
        let expected = Ask::Tunnel {
            host: "example.com".into(),
            port: 443,
        };
        assert_eq!((parsed, &text[len..]), (expected, "hello"));
        let (parsed, _) = ask("CONNECT [::1]:8080 HTTP/1.1\r\n\r\n").unwrap().unwrap();
        let expected = Ask::Tunnel {
            host: "::1".into(),
            port: 8080,
        };
        assert_eq!(parsed, expected);
    }

    #[test]
    fn a_partial_head_asks_for_more() {
        assert_eq!(ask("CONNECT example.com:443 HTTP/1.1\r\n").unwrap(), None);
    }

    #[test]
    fn a_connect_without_a_good_port_is_rejected() {
        for target in [
            "example.com",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:+1",
            ":443",
            "::1:443",
            "[::1]",
            "http://example.com:443",
        ] {
            let text = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
            assert_eq!(status(ask(&text)), 400, "{target}");
        }
    }

    #[test]
    fn only_an_absolute_url_is_read_and_only_http_is_forwarded() {
        let text = "GET http://example.com/a?b=1 HTTP/1.1\r\nAccept: */*\r\n\r\n";
        let (Ask::Forward(forward), _) = ask(text).unwrap().unwrap() else {
            panic!("not a forward");
        };
        assert_eq!(forward.url, "http://example.com/a?b=1");
        assert_eq!((forward.method.as_str(), forward.minor), ("GET", 1));
        assert_eq!(forward.not_http(), None);
        for text in [
            "GET https://example.com/ HTTP/1.1\r\n\r\n",
            "GET ftp://example.com/ HTTP/1.1\r\n\r\n",
        ] {
            let (Ask::Forward(forward), _) = ask(text).unwrap().unwrap() else {
                panic!("not a forward");
            };
            assert!(forward.not_http().is_some(), "{text:?}");
        }
        for text in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET /a://b HTTP/1.1\r\n\r\n",
            "GET example.com HTTP/1.1\r\n\r\n",
            "\u{16}\u{3}\u{1}garbage\r\n\r\n",
            "hello there\r\n\r\n",
        ] {
            assert_eq!(status(ask(text)), 400, "{text:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_does_not_end_within_the_timeout_is_rejected_with_408() {
        let (mut near, mut far) = tokio::io::duplex(1024);
        tokio::io::AsyncWriteExt::write_all(&mut far, b"CONNECT example.com:443 HTTP/1.1\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let rejected = read_head(&mut near).await.unwrap_err();
        assert_eq!(
            rejected,
            HeadError::Rejected {
                status: 408,
                line: "the request head did not arrive within 10 s".into()
            }
        );
        assert_eq!(started.elapsed(), HEAD_TIMEOUT);
    }

    #[tokio::test]
    async fn a_head_over_16_kib_is_rejected_with_431_and_a_closed_client_is_gone() {
        let (mut near, mut far) = tokio::io::duplex(64 * 1024);
        let big = format!(
            "GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        tokio::io::AsyncWriteExt::write_all(&mut far, big.as_bytes())
            .await
            .unwrap();
        let rejected = read_head(&mut near).await.unwrap_err();
        assert!(
            matches!(rejected, HeadError::Rejected { status: 431, .. }),
            "{rejected:?}"
        );
        drop(far);
        let (mut near, far) = tokio::io::duplex(64);
        drop(far);
        assert_eq!(read_head(&mut near).await.unwrap_err(), HeadError::Gone);
    }

    #[test]
    fn too_many_fields_are_rejected() {
        let mut text = String::from("GET http://example.com/ HTTP/1.1\r\n");
        for i in 0..=MAX_FIELDS {
            text.push_str(&format!("X-{i}: v\r\n"));
        }
        text.push_str("\r\n");
        assert_eq!(status(ask(&text)), 431);
    }

    #[test]
    fn the_origin_form_drops_the_proxy_and_hop_fields_and_closes() {
        let text = "POST http://Example.com:8080/a/b?q=1 HTTP/1.1\r\nHost: elsewhere\r\n\
                    Proxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\n\
                    Connection: keep-alive, X-Drop\r\nKeep-Alive: 5\r\nX-Drop: 1\r\n\
                    Upgrade: h2c\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\n\
                    Content-Type: text/plain\r\n\r\n";
        let (Ask::Forward(forward), _) = ask(text).unwrap().unwrap() else {
            panic!("not a forward");
        };
        let url = url::Url::parse(&forward.url).unwrap();
        let head = String::from_utf8(origin_form(&forward, &url)).unwrap();
        assert_eq!(
            head,
            "POST /a/b?q=1 HTTP/1.1\r\nHost: example.com:8080\r\n\
             Transfer-Encoding: chunked\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
        );
    }
}
