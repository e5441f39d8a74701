//! The sandbox's egress proxy: the one way out of a local MCP server's network namespace,
//! under the guard, the allow list and the audit of every other outbound call (V10).
//!
//! [`EgressClient::serve_proxy`] serves HTTP proxy requests on a listener. Per
//! connection, in order: the head (bounded, `head`), the guard on its target, the intent
//! row, the connection to a vetted address only, then the bytes copied both ways
//! (`counted`) and the outcome row naming the intent (`record`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::EgressClient;
use crate::delivery::Delivery;
use crate::error::EgressError;
use crate::guard::{self, GuardRefusal, VettedTarget};
use crate::scrub::Scrubber;
use crate::signal::CancellationSignal;

mod closing;
mod counted;
mod head;
mod record;

use closing::ClosingAnswer;
use counted::Counted;
use head::{Ask, Head, HeadError};
use record::{Ending, Kind, ProxyRecord, host_port};

/// Whom the proxied connections are for, as their audit rows say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLabel {
    /// The rows' actor, e.g. `mcp:files`.
    pub actor: String,
    /// The rows' reason, e.g. `sandbox egress of mcp server files`; an outcome row adds
    /// the bytes each way.
    pub reason: String,
}

/// The most connections the proxy holds open at once. Past it, it accepts the next only
/// when one has ended (the kernel's backlog holds the rest), so a child cannot spend the
/// process's tasks, sockets and audit log without bound.
pub const PROXY_MAX_CONNECTIONS: usize = 256;

/// The pause after a failed accept (out of file descriptors, say) before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

impl EgressClient {
    /// Serves HTTP proxy requests on `listener` until `stop` says cancelled: `CONNECT
    /// host:port` tunnels and plain HTTP requests in absolute form, each connection on
    /// its own task, each target vetted by the guard and audited like the vault's own
    /// calls; at most [`PROXY_MAX_CONNECTIONS`] at once. When `stop` fires it stops accepting, ends every open connection (writing
    /// its outcome row) and returns once all have ended.
    ///
    /// `stop` is asked whenever it wakes, and at the client's tick (a signal that cannot
    /// wake) or backstop tick (one that can), as a call in flight asks it.
    pub async fn serve_proxy(
        self: Arc<Self>,
        listener: TcpListener,
        label: ProxyLabel,
        stop: Arc<dyn CancellationSignal>,
    ) {
        let label = Arc::new(label);
        let mut connections = JoinSet::new();
        loop {
            let full = connections.len() >= PROXY_MAX_CONNECTIONS;
            let accepted = tokio::select! {
                biased;
                () = self.stopped(&*stop) => break,
                accepted = listener.accept(), if !full => accepted,
                Some(_) = connections.join_next() => continue,
            };
            match accepted {
                Ok((stream, _)) => {
                    let task = self
                        .clone()
                        .proxy_connection(stream, label.clone(), stop.clone());
                    connections.spawn(task);
                }
                Err(error) => {
                    // A failed accept is about one connection or a passing shortage; the
                    // proxy goes on after a short pause, as hyper's servers do.
                    tracing::warn!(%error, actor = %label.actor, "the egress proxy could not accept a connection");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_PAUSE) => {}
                        () = self.stopped(&*stop) => break,
                    }
                }
            }
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
    }

    /// Resolves once `signal` says cancelled, asking it as a call in flight does (V6).
    async fn stopped(&self, signal: &dyn CancellationSignal) {
        let tick = match signal.wakes() {
            true => self.config.backstop_tick,
            false => self.config.tick,
        };
        loop {
            let woken = signal.woken();
            if signal.is_cancelled() {
                return;
            }
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(tick) => {}
            }
        }
    }

    /// One proxied connection, from its head to its outcome row.
    async fn proxy_connection(
        self: Arc<Self>,
        mut client: TcpStream,
        label: Arc<ProxyLabel>,
        stop: Arc<dyn CancellationSignal>,
    ) {
        let head = tokio::select! {
            biased;
            () = self.stopped(&*stop) => return,
            head = head::read_head(&mut client) => head,
        };
        let head = match head {
            Ok(head) => head,
            Err(HeadError::Gone) => return,
            Err(HeadError::Rejected { status, line }) => {
                return answer(&mut client, status, &line).await;
            }
        };
        let scrubber = match self.scrubber(None, None).await {
            Ok(scrubber) => scrubber,
            Err(error) => {
                tracing::error!(%error, "the egress proxy could not read the vault's secrets to scrub its rows");
                let line =
                    "runwarden could not read its vault, so nothing was sent: try again later";
                return answer(&mut client, 503, line).await;
            }
        };
        if let Ask::Forward(forward) = &head.ask
            && let Some(line) = forward.not_http()
        {
            // Not forwarded, but it names a target: the row says who tried what.
            let (written, path) = written_target(&forward.url);
            let record = ProxyRecord::new(Kind::Request, &forward.method, written, path, &label);
            let error = EgressError::NotProxied {
                reason: line.into(),
            };
            self.proxy_refused(&record, 400, error, &scrubber).await;
            return answer(&mut client, 400, line).await;
        }
        // A lookup can be slow; a stop before the guard has decided leaves nothing behind.
        let (record, vetted) = tokio::select! {
            biased;
            () = self.stopped(&*stop) => return,
            vetted = self.vet(&head, &label) => vetted,
        };
        let Some((record, target)) = self.admit(&mut client, record, vetted, &scrubber).await
        else {
            return;
        };
        let opened = tokio::select! {
            biased;
            () = self.stopped(&*stop) => Err(EgressError::ProxyStopped { host: record.host.clone() }),
            opened = self.open(&target) => opened,
        };
        let upstream = match opened {
            Ok(upstream) => upstream,
            Err(error) => {
                let line = connect_failure(&record.host, &error);
                let ending = Ending {
                    status: 502,
                    error: Some(error),
                    sent: 0,
                    received: 0,
                };
                self.proxy_ended(&record, ending, &scrubber).await;
                return answer(&mut client, 502, &line).await;
            }
        };
        let ending = self
            .relay(client, upstream, head, &target, &record.host, &*stop)
            .await;
        self.proxy_ended(&record, ending, &scrubber).await;
    }

    /// V4: the guard's decision on the head's target, and the record of its rows.
    async fn vet(
        &self,
        head: &Head,
        label: &ProxyLabel,
    ) -> (ProxyRecord, Result<VettedTarget, GuardRefusal>) {
        let policy = &self.config.policy;
        let resolver = &*self.resolver;
        match &head.ask {
            Ask::Tunnel { host, port } => {
                let written = host_port(host, *port);
                let record =
                    ProxyRecord::new(Kind::Tunnel, "CONNECT", written, String::new(), label);
                let vetted = guard::vet_authority(policy, resolver, host, *port).await;
                (record, vetted)
            }
            Ask::Forward(forward) => {
                let (written, path) = written_target(&forward.url);
                let record = ProxyRecord::new(Kind::Request, &forward.method, written, path, label);
                let vetted = guard::vet_target(policy, resolver, &forward.url).await;
                (record, vetted)
            }
        }
    }

    /// The refusal or the intent row: the record and the vetted target of a connection
    /// that may be made, or `None` once the client has its refusal and the row is written.
    async fn admit(
        &self,
        client: &mut TcpStream,
        mut record: ProxyRecord,
        vetted: Result<VettedTarget, GuardRefusal>,
        scrubber: &Scrubber,
    ) -> Option<(ProxyRecord, VettedTarget)> {
        let target = match vetted {
            Ok(target) => target,
            Err(refusal) => {
                let line = format!("runwarden refused {}: {refusal}", record.host);
                self.proxy_refused(&record, 403, refusal.into(), scrubber)
                    .await;
                answer(client, 403, &line).await;
                return None;
            }
        };
        record.vetted(&target);
        // V7: no connection without its intent row on disk.
        if let Err(error) = self.proxy_intent(&mut record, scrubber).await {
            let host = scrubber.text(&record.host);
            tracing::error!(%error, %host, "the egress proxy could not write an intent row");
            self.proxy_refused(&record, 503, error, scrubber).await;
            let line = format!(
                "runwarden could not write its audit log, so it did not connect to {}: try again later",
                record.host
            );
            answer(client, 503, &line).await;
            return None;
        }
        Some((record, target))
    }

    /// The bytes of a connection that was made, both ways until both sides end, an error
    /// breaks it or `stop` fires; a tunnel first tells the client it is open, a request
    /// first sends its head in origin form.
    async fn relay(
        &self,
        mut client: TcpStream,
        upstream: TcpStream,
        head: Head,
        target: &VettedTarget,
        host: &str,
        stop: &dyn CancellationSignal,
    ) -> Ending {
        let mut upstream = Counted::new(upstream);
        let Head { ask, rest } = head;
        let status = match &ask {
            Ask::Tunnel { .. } => Some(200),
            Ask::Forward(_) => None,
        };
        let copied = async {
            match &ask {
                Ask::Tunnel { .. } => {
                    client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await?;
                    upstream.write_all(&rest).await?;
                    tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                }
                Ask::Forward(forward) => {
                    upstream
                        .write_all(&head::origin_form(forward, &target.url))
                        .await?;
                    upstream.write_all(&rest).await?;
                    // The answer's head tells the client the connection ends with it.
                    let mut answer = ClosingAnswer::new(&mut upstream);
                    tokio::io::copy_bidirectional(&mut client, &mut answer).await
                }
            }
        };
        let error = tokio::select! {
            biased;
            () = self.stopped(stop) => Some(EgressError::ProxyStopped { host: host.to_string() }),
            copied = copied => copied.err().map(|error| EgressError::Transport {
                host: host.to_string(),
                detail: error.to_string(),
                delivery: Delivery::MaybeDelivered,
            }),
        };
        Ending {
            status: status.or(upstream.answered_status()).unwrap_or(0),
            error,
            sent: upstream.sent,
            received: upstream.received,
        }
    }

    /// V4: a connection to one of the addresses the guard vetted, never a new lookup,
    /// within the connect timeout.
    async fn open(&self, target: &VettedTarget) -> Result<TcpStream, EgressError> {
        let host = host_port(&target.host, target.port);
        let timeout = self.config.connect_timeout;
        let attempts = async {
            let mut last = None;
            for &ip in &target.addrs {
                match TcpStream::connect(SocketAddr::new(ip, target.port)).await {
                    Ok(stream) => return Ok(stream),
                    Err(error) => last = Some(error),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
        };
        match tokio::time::timeout(timeout, attempts).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => Err(EgressError::Transport {
                host,
                detail: error.to_string(),
                delivery: Delivery::NotSent,
            }),
            Err(_) => Err(EgressError::Timeout {
                host,
                after: timeout,
                delivery: Delivery::NotSent,
            }),
        }
    }
}

/// What the client reads when the proxy could not connect to `host`.
fn connect_failure(host: &str, error: &EgressError) -> String {
    match error {
        EgressError::Transport { detail, .. } => {
            format!("runwarden could not connect to {host}: {detail}")
        }
        EgressError::Timeout { after, .. } => format!(
            "runwarden could not connect to {host} within {} s",
            after.as_secs_f64()
        ),
        other => other.to_string(),
    }
}

/// The `host:port` and path of an absolute URL as the client wrote it, for the row of a
/// request the guard refuses: never the query or userinfo.
fn written_target(url: &str) -> (String, String) {
    match url::Url::parse(url) {
        Ok(parsed) if parsed.host_str().is_some() => {
            let host = match parsed.host() {
                Some(url::Host::Ipv6(ip)) => ip.to_string(),
                _ => parsed.host_str().unwrap_or_default().to_string(),
            };
            let port = parsed.port_or_known_default().unwrap_or(80);
            (host_port(&host, port), parsed.path().to_string())
        }
        _ => guard::describe_for_audit(url),
    }
}

/// Answers `status` with `line` as a one-line plain-text body, and closes.
async fn answer(client: &mut TcpStream, status: u16, line: &str) {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!("{line}\n");
    let response = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The client may be gone already; there is no one left to tell.
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
    // What the client sent past the head and has arrived is read away: a socket closed
    // with unread bytes resets the connection, and the client could lose the answer.
    let mut drained = 0;
    let mut sink = [0u8; 4096];
    while drained < DRAIN_LIMIT {
        match client.try_read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// The most a refused client's unread bytes are read away before its socket is closed.
const DRAIN_LIMIT: usize = 64 * 1024;
