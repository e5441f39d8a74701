//! The sandbox's egress proxy (V10): a real listener on 127.0.0.1 as the proxy, real TCP
//! servers as targets, and a client speaking raw CONNECT and absolute-form requests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runwarden_vault::audit::action;
use runwarden_vault::{
    AuditRow, CancelFlag, Delivery, EgressClient, EgressConfig, EgressPolicy, ProxyLabel, Resolver,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::support::{Captured, Fixture, SIGIL, ScriptedResolver, fixture_with};

/// How long a test waits for an event before it fails.
const WAIT: Duration = Duration::from_secs(10);

const REASON: &str = "sandbox egress of mcp server files";

/// A proxy serving on 127.0.0.1 over a fixture's vault, and what it tells its observer.
struct Proxy {
    f: Fixture,
    addr: SocketAddr,
    stop: CancelFlag,
    served: JoinHandle<()>,
    /// The action of every row the proxy has written, as it is written.
    rows: mpsc::UnboundedReceiver<String>,
}

async fn proxy(allow: &[&str], resolver: Arc<dyn Resolver>) -> Proxy {
    let f = fixture_with(allow, resolver.clone(), runwarden_vault::MAX_TICK).await;
    let config = EgressConfig {
        policy: EgressPolicy::new(allow).unwrap(),
        connect_timeout: Duration::from_secs(5),
        ..EgressConfig::default()
    };
    let (tell, rows) = mpsc::unbounded_channel();
    let observer = Arc::new(move |action: &str, _: Delivery| {
        let _ = tell.send(action.to_string());
    });
    let client =
        EgressClient::with_resolver(f.vault.clone(), config, resolver).with_observer(observer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancelFlag::new();
    let label = ProxyLabel {
        actor: "mcp:files".into(),
        reason: REASON.into(),
    };
    let served =
        tokio::spawn(Arc::new(client).serve_proxy(listener, label, Arc::new(stop.clone())));
    Proxy {
        f,
        addr,
        stop,
        served,
        rows,
    }
}

async fn loopback_proxy() -> Proxy {
    proxy(&["127.0.0.1"], Arc::new(ScriptedResolver::default())).await
}

impl Proxy {
    /// Waits until the proxy has written a row with `action`.
    async fn row_written(&mut self, expected: &str) {
        let waited = tokio::time::timeout(WAIT, async {
            while let Some(action) = self.rows.recv().await {
                if action == expected {
                    return;
                }
            }
            panic!("the proxy stopped before writing {expected}");
        });
        waited.await.expect("the row was written in time");
    }

    async fn audit(&self) -> Vec<AuditRow> {
        self.f.audit().await
    }
}

/// A connection to the proxy that has sent `head`.
async fn ask(proxy: SocketAddr, head: &str) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Everything the proxy answers until it closes.
async fn answer_of(mut stream: TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("the proxy answered in time")
        .unwrap();
    String::from_utf8(answer).unwrap()
}

/// The proxy's answer to `head`.
async fn proxy_answer(proxy: SocketAddr, head: &str) -> String {
    answer_of(ask(proxy, head).await).await
}

/// Reads a response head byte by byte, so nothing of what follows is consumed.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tokio::time::timeout(WAIT, stream.read_u8())
            .await
            .expect("the head came in time")
            .unwrap();
        head.push(byte);
    }
    String::from_utf8(head).unwrap()
}

/// A TCP server on 127.0.0.1 that echoes one connection until it ends.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
    });
    addr
}

/// A listener that accepts nothing: `accept` on it says whether anyone connected.
fn silent_target() -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

fn saw_no_connection(target: &std::net::TcpListener) -> bool {
    matches!(target.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[tokio::test]
async fn a_connect_to_an_allowed_target_tunnels_both_ways_and_writes_intent_and_outcome() {
    let mut p = loopback_proxy().await;
    let target = echo_server().await;
    let mut stream = ask(
        p.addr,
        &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
    )
    .await;
    assert_eq!(
        read_head(&mut stream).await,
        "HTTP/1.1 200 Connection established\r\n\r\n"
    );
    stream.write_all(b"ping through the tunnel").await.unwrap();
    let mut echoed = [0u8; 23];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping through the tunnel");
    stream.write_all(&[b'x'; 5000]).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest.len(), 5000);
    p.row_written(action::PROXY_CONNECT).await;

    let rows = p.audit().await;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let (intent, outcome) = (&rows[0].event, &rows[1].event);
    assert_eq!(intent.action, action::PROXY_CONNECT_STARTED);
    assert_eq!(outcome.action, action::PROXY_CONNECT);
    assert_eq!(outcome.intent_id, Some(rows[0].id));
    for event in [intent, outcome] {
        assert_eq!(event.host, target.to_string());
        assert_eq!(
            (event.method.as_str(), event.path.as_str()),
            ("CONNECT", "")
        );
        assert_eq!(event.actor, "mcp:files");
    }
    assert_eq!(intent.reason.as_deref(), Some(REASON));
    assert_eq!(
        (outcome.status, outcome.success, &outcome.error),
        (200, true, &None)
    );
    assert_eq!(
        outcome.reason.as_deref(),
        Some("sandbox egress of mcp server files: 5,023 bytes out, 5,023 in")
    );
    let report = p.f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.incomplete_calls, 0);
}

#[tokio::test]
async fn refused_targets_get_403_and_one_row_and_nothing_is_connected() {
    let p = proxy(&[], Arc::new(ScriptedResolver::default())).await;
    let target = silent_target();
    let loopback = target.local_addr().unwrap().to_string();
    let cases = [
        (loopback.as_str(), "loopback 127.0.0.0/8"),
        ("10.1.2.3:80", "private 10.0.0.0/8"),
        (
            "169.254.169.254:80",
            "link-local 169.254.0.0/16 (cloud metadata)",
        ),
    ];
    for (i, (host, range)) in cases.into_iter().enumerate() {
        let answer = proxy_answer(p.addr, &format!("CONNECT {host} HTTP/1.1\r\n\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        assert!(
            body.starts_with(&format!("runwarden refused {host}: ")),
            "{body}"
        );
        assert!(body.contains(range), "{body}");
        assert_eq!(body.lines().count(), 1, "{body}");

        let rows = p.audit().await;
        assert_eq!(rows.len(), i + 1, "one row per refusal: {rows:#?}");
        let row = &rows[i].event;
        assert_eq!(row.action, action::PROXY_CONNECT_REFUSED);
        assert_eq!(
            (row.host.as_str(), row.status, row.success),
            (host, 403, false)
        );
        assert!(row.error.as_deref().unwrap().contains(range), "{row:?}");
    }
    assert!(
        saw_no_connection(&target),
        "the refused loopback port saw a connection"
    );
}

#[tokio::test]
async fn a_name_resolving_to_a_private_address_is_refused() {
    let resolver = ScriptedResolver::default().with("files.internal", &["10.0.0.7"], &["10.0.0.7"]);
    let p = proxy(&["127.0.0.1"], Arc::new(resolver)).await;
    let answer = proxy_answer(p.addr, "CONNECT files.internal:443 HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.contains("runwarden refused files.internal:443: "),
        "{answer}"
    );
    assert!(
        answer.contains("10.0.0.7 in private 10.0.0.0/8"),
        "{answer}"
    );
    let rows = p.audit().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].event.action, action::PROXY_CONNECT_REFUSED);
}

#[tokio::test]
async fn a_name_is_looked_up_once_and_only_its_vetted_address_is_dialled() {
    // A second lookup would answer a private address (DNS rebinding).
    let resolver = ScriptedResolver::default().with("echo.test", &["127.0.0.1"], &["10.0.0.1"]);
    let mut p = proxy(&["127.0.0.1"], Arc::new(resolver)).await;
    let target = echo_server().await;
    let head = format!("CONNECT echo.test:{} HTTP/1.1\r\n\r\n", target.port());
    let mut stream = ask(p.addr, &head).await;
    assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200 "));
    stream.write_all(b"hi").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"hi");
    p.row_written(action::PROXY_CONNECT).await;
    assert_eq!(
        p.audit().await[1].event.host,
        format!("echo.test:{}", target.port())
    );
}

/// A tiny HTTP server on 127.0.0.1 that answers one request and hands over its head.
async fn http_server() -> (SocketAddr, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tell, head) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let received = read_head(&mut stream).await;
        let _ = tell.send(received);
        let answer = "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nConnection: close\r\n\r\nmade!";
        stream.write_all(answer.as_bytes()).await.unwrap();
    });
    (addr, head)
}

#[tokio::test]
async fn an_absolute_form_request_is_forwarded_in_origin_form_and_audited() {
    let mut p = loopback_proxy().await;
    let (target, received) = http_server().await;
    let head = format!(
        "GET http://{target}/tickets/new?title=x HTTP/1.1\r\nHost: elsewhere.example\r\n\
         Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nAccept: */*\r\n\r\n"
    );
    let answer = proxy_answer(p.addr, &head).await;
    assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nmade!"), "{answer}");
    let received = received.await.unwrap();
    assert_eq!(
        received,
        format!(
            "GET /tickets/new?title=x HTTP/1.1\r\nHost: {target}\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        )
    );
    p.row_written(action::PROXY_REQUEST).await;

    let rows = p.audit().await;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[0].event.action, action::PROXY_REQUEST_STARTED);
    let outcome = &rows[1].event;
    assert_eq!(outcome.action, action::PROXY_REQUEST);
    assert_eq!(outcome.intent_id, Some(rows[0].id));
    assert_eq!(
        (
            outcome.method.as_str(),
            outcome.host.clone(),
            outcome.path.as_str()
        ),
        ("GET", target.to_string(), "/tickets/new")
    );
    assert_eq!((outcome.status, outcome.success), (201, true));
    let sent = received.len();
    let expected = format!("{REASON}: {sent} bytes out, {} in", answer.len());
    assert_eq!(outcome.reason.as_deref(), Some(expected.as_str()));
}

#[tokio::test]
async fn garbage_and_an_oversized_head_are_rejected_without_a_row() {
    let p = loopback_proxy().await;
    let cases = [
        ("hello there\r\n\r\n", "400 Bad Request"),
        ("GET / HTTP/1.1\r\nHost: x\r\n\r\n", "400 Bad Request"),
        ("CONNECT example.com HTTP/1.1\r\n\r\n", "400 Bad Request"),
    ];
    for (head, status) in cases {
        let answer = proxy_answer(p.addr, head).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{head:?}: {answer}"
        );
    }
    let big = format!(
        "GET http://127.0.0.1:9/ HTTP/1.1\r\nX-Big: {}\r\n",
        "a".repeat(17 * 1024)
    );
    let stream = ask(p.addr, &big).await;
    let answer = answer_of(stream).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert!(
        answer.ends_with("the request head is over 16 KiB\n"),
        "{answer}"
    );
    assert!(p.audit().await.is_empty());
}

#[tokio::test]
async fn stop_ends_an_open_tunnel_promptly_and_its_row_says_so() {
    let mut p = loopback_proxy().await;
    let target = echo_server().await;
    let mut stream = ask(p.addr, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
    assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200 "));
    stream.write_all(b"open").await.unwrap();
    let mut echoed = [0u8; 4];
    stream.read_exact(&mut echoed).await.unwrap();

    let stopped_at = std::time::Instant::now();
    p.stop.cancel();
    tokio::time::timeout(WAIT, &mut p.served)
        .await
        .expect("the proxy ended in time")
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest)).await;
    assert!(
        read.expect("the tunnel closed in time")
            .is_ok_and(|n| n == 0)
    );
    assert!(
        stopped_at.elapsed() < Duration::from_secs(1),
        "{:?}",
        stopped_at.elapsed()
    );
    p.row_written(action::PROXY_CONNECT).await;

    let outcome = p.audit().await.pop().unwrap().event;
    assert_eq!(
        (outcome.action.as_str(), outcome.success),
        (action::PROXY_CONNECT, false)
    );
    assert_eq!(
        outcome.error.as_deref(),
        Some(
            format!("runwarden stopped the proxy while the connection to {target} was open")
                .as_str()
        )
    );
    assert!(
        TcpStream::connect(p.addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn an_audit_log_that_cannot_be_written_answers_503_and_connects_nowhere() {
    let p = loopback_proxy().await;
    let target = silent_target();
    let host = target.local_addr().unwrap();
    p.f.store
        .fail_next
        .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    let answer = proxy_answer(p.addr, &format!("CONNECT {host} HTTP/1.1\r\n\r\n")).await;
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with(&format!(
            "runwarden could not write its audit log, so it did not connect to {host}: try again later\n"
        )),
        "{answer}"
    );
    assert!(saw_no_connection(&target), "the target saw a connection");
    p.f.store
        .fail_next
        .store(0, std::sync::atomic::Ordering::SeqCst);
    assert!(p.audit().await.is_empty(), "every write failed");
}

#[tokio::test]
async fn a_closed_port_answers_502_with_an_outcome_row() {
    let mut p = loopback_proxy().await;
    let closed = silent_target().local_addr().unwrap();
    let answer = proxy_answer(p.addr, &format!("CONNECT {closed} HTTP/1.1\r\n\r\n")).await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains(&format!(
            "runwarden could not connect to {closed}: Connection refused"
        )),
        "{answer}"
    );
    p.row_written(action::PROXY_CONNECT).await;
    let rows = p.audit().await;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!((rows[1].event.status, rows[1].event.success), (502, false));
    assert_eq!(rows[1].event.intent_id, Some(rows[0].id));
}

#[tokio::test]
async fn a_secret_a_child_writes_into_a_target_never_reaches_a_row() {
    let p = proxy(&[], Arc::new(ScriptedResolver::default())).await;
    p.f.put_sigil("files-token").await;
    let answer = proxy_answer(
        p.addr,
        &format!("CONNECT {SIGIL}.test:443 HTTP/1.1\r\n\r\n"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
    let head = format!("GET http://10.0.0.1/{SIGIL}?key={SIGIL} HTTP/1.1\r\n\r\n");
    let answer = proxy_answer(p.addr, &head).await;
    assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
    let rows = p.audit().await;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[1].event.action, action::PROXY_REQUEST_REFUSED);
    let printed = format!("{rows:?}");
    assert!(!printed.contains(SIGIL), "{printed}");
    assert!(printed.contains("[redacted]"), "{printed}");
}

#[tokio::test]
async fn verify_counts_a_proxy_intent_without_its_outcome_as_incomplete() {
    let mut p = loopback_proxy().await;
    let target = echo_server().await;
    let mut stream = ask(p.addr, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
    assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200 "));
    // The tunnel is open: its intent is on disk and its outcome is not yet written.
    let report = p.f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.incomplete_calls, 1);
    let intent = &p.audit().await[0];
    let open = p.f.vault.audit_incomplete(vec![intent.id]).await.unwrap();
    assert_eq!(open, vec![intent.id]);
    drop(stream);
    p.row_written(action::PROXY_CONNECT).await;
    let report = p.f.vault.audit_verify().await.unwrap();
    assert_eq!(report.incomplete_calls, 0);
}

#[tokio::test]
async fn bytes_sent_right_after_the_connect_head_reach_the_target() {
    let mut p = loopback_proxy().await;
    let target = echo_server().await;
    let mut stream = ask(
        p.addr,
        &format!("CONNECT {target} HTTP/1.1\r\n\r\nearly bytes"),
    )
    .await;
    assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200 "));
    stream.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"early bytes");
    p.row_written(action::PROXY_CONNECT).await;
}

/// A resolver whose lookups never end, and that says when it is asked.
struct Hanging(mpsc::UnboundedSender<()>);

#[async_trait::async_trait]
impl Resolver for Hanging {
    async fn resolve(&self, _: &str) -> std::io::Result<Vec<std::net::IpAddr>> {
        let _ = self.0.send(());
        std::future::pending().await
    }
}

#[tokio::test]
async fn stop_during_a_slow_lookup_ends_the_connection_and_leaves_no_row() {
    let (asked, mut lookups) = mpsc::unbounded_channel();
    let mut p = proxy(&[], Arc::new(Hanging(asked))).await;
    let stream = ask(p.addr, "CONNECT slow.test:443 HTTP/1.1\r\n\r\n").await;
    tokio::time::timeout(WAIT, lookups.recv()).await.unwrap();
    p.stop.cancel();
    tokio::time::timeout(WAIT, &mut p.served)
        .await
        .expect("the proxy ended in time")
        .unwrap();
    assert_eq!(answer_of(stream).await, "", "closed without an answer");
    assert!(p.audit().await.is_empty());
}

#[tokio::test]
async fn an_absolute_https_url_is_refused_with_400_and_a_row_naming_its_target() {
    let p = loopback_proxy().await;
    let target = silent_target();
    let host = target.local_addr().unwrap();
    let head = format!("GET https://{host}/a?k=v HTTP/1.1\r\n\r\n");
    let answer = proxy_answer(p.addr, &head).await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    let line = "send https through CONNECT host:443, not as an absolute https:// URL";
    assert!(answer.ends_with(&format!("\r\n\r\n{line}\n")), "{answer}");
    let row = p.f.only_audit_row().await.event;
    assert_eq!(row.action, action::PROXY_REQUEST_REFUSED);
    assert_eq!(
        (row.method.as_str(), row.path.as_str(), row.status),
        ("GET", "/a", 400)
    );
    assert_eq!(row.host, host.to_string());
    assert_eq!(row.error, Some(format!("not sent: {line}")));
    assert!(saw_no_connection(&target));
}

#[tokio::test]
async fn a_real_http_client_posts_through_the_proxy_with_its_body() {
    use runwarden_testkit::{HttpReply, TestServer};
    let mut p = loopback_proxy().await;
    let mut server = TestServer::start(|request| {
        HttpReply::text(200, &format!("got {} bytes", request.body.len()))
    })
    .await;
    let proxied = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{}", p.addr)).unwrap())
        .build()
        .unwrap();
    for n in 1..=2 {
        let answer = proxied
            .post(server.url("/tools/call"))
            .body(vec![b'x'; 3000 * n])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.text().await.unwrap(),
            format!("got {} bytes", 3000 * n)
        );
        let seen = server.next_request(WAIT).await;
        assert_eq!(
            (seen.method.as_str(), seen.target.as_str()),
            ("POST", "/tools/call")
        );
        assert_eq!(seen.header("connection"), Some("close"));
        p.row_written(action::PROXY_REQUEST).await;
    }
    let outcomes: Vec<_> = p
        .audit()
        .await
        .into_iter()
        .filter(|r| r.event.action == action::PROXY_REQUEST)
        .collect();
    assert_eq!(outcomes.len(), 2);
    assert!(
        outcomes
            .iter()
            .all(|r| r.event.success && r.event.method == "POST")
    );
}

#[tokio::test]
async fn a_secret_in_a_target_the_proxy_reaches_stays_out_of_its_rows_and_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let name = format!("{SIGIL}.test");
    let resolver = ScriptedResolver::default().with(&name, &["127.0.0.1"], &["127.0.0.1"]);
    let mut p = proxy(&["127.0.0.1"], Arc::new(resolver)).await;
    p.f.put_sigil("files-token").await;
    let target = echo_server().await;
    let head = format!("CONNECT {name}:{} HTTP/1.1\r\n\r\n", target.port());
    let mut stream = ask(p.addr, &head).await;
    assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200 "));
    stream.shutdown().await.unwrap();
    stream.read_to_end(&mut Vec::new()).await.unwrap();
    p.row_written(action::PROXY_CONNECT).await;

    // The same target while the log cannot be written: the failure is logged.
    p.f.store
        .fail_next
        .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    assert!(
        proxy_answer(p.addr, &head)
            .await
            .starts_with("HTTP/1.1 503 ")
    );
    p.f.store
        .fail_next
        .store(0, std::sync::atomic::Ordering::SeqCst);

    let rows = format!("{:?}", p.audit().await);
    assert!(!rows.contains(SIGIL), "{rows}");
    assert!(rows.contains("[redacted].test:"), "{rows}");
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("could not write an intent row"), "{logs}");
    assert!(!logs.contains(SIGIL), "{logs}");
}

#[tokio::test]
async fn past_its_cap_the_proxy_takes_the_next_connection_only_when_one_has_ended() {
    let mut p = loopback_proxy().await;
    let mut idle = Vec::new();
    for _ in 0..runwarden_vault::PROXY_MAX_CONNECTIONS {
        idle.push(TcpStream::connect(p.addr).await.unwrap());
    }
    // One more asks for a tunnel while every slot is taken.
    let held_target = echo_server().await;
    let mut held = ask(p.addr, &format!("CONNECT {held_target} HTTP/1.1\r\n\r\n")).await;
    // One of the first ends its own tunnel, which frees its slot.
    let first_target = echo_server().await;
    let mut first = idle.pop().unwrap();
    first
        .write_all(format!("CONNECT {first_target} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert!(read_head(&mut first).await.starts_with("HTTP/1.1 200 "));
    first.shutdown().await.unwrap();
    first.read_to_end(&mut Vec::new()).await.unwrap();
    p.row_written(action::PROXY_CONNECT).await;
    // Only now is the held connection taken: its intent follows the first's outcome.
    assert!(read_head(&mut held).await.starts_with("HTTP/1.1 200 "));
    let rows = p.audit().await;
    let hosts: Vec<(&str, String)> = rows
        .iter()
        .map(|r| (r.event.action.as_str(), r.event.host.clone()))
        .collect();
    let first_host = first_target.to_string();
    let held_host = held_target.to_string();
    assert_eq!(
        hosts[..3],
        [
            (action::PROXY_CONNECT_STARTED, first_host.clone()),
            (action::PROXY_CONNECT, first_host),
            (action::PROXY_CONNECT_STARTED, held_host),
        ],
        "{rows:#?}"
    );
}
