//! Plain HTTP through the sandbox's proxy: absolute-form requests forwarded in origin
//! form, and what is not forwarded.

use super::*;

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
