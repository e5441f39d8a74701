//! The sandbox's proxy as a whole: stopping it, its cap on open connections, and secrets
//! a child writes into a target.

use super::*;

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
