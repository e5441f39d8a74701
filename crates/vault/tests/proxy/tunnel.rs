//! `CONNECT` through the sandbox's proxy: tunnels, refusals, failures and their rows.

use super::*;

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
