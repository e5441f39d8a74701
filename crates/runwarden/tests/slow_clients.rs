//! The API serves its users while a stranger misbehaves, over real sockets against a real
//! `runwarden serve`: one address (127.0.0.2: all of 127/8 is loopback) that holds twice
//! the connection cap with half-open connections or sign-in forms sent a byte at a time
//! gets its share and no more, so an authenticated request from 127.0.0.1 answers within
//! a second; a body over the limit is answered 413 in our error shape even to a client
//! that sends all of it before reading.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{Live, Sandbox, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);
/// The connection cap of these tests, and one address's share of it.
const CAP: usize = 8;
const SHARE: usize = 4;

/// A serving sandbox with a small cap, short timeouts, and a viewer token.
async fn served() -> (Arc<Sandbox>, Live, String, String) {
    let sandbox = Arc::new(Sandbox::initialised());
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[serve]\nmax_connections = {CAP}\nmax_connections_per_client = {SHARE}\nheader_read_timeout_seconds = 1\nbody_read_timeout_seconds = 1\nidle_timeout_seconds = 2\n"
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let created = runwarden(&sandbox, &["--json", "token", "create", "--role", "viewer"])
        .await
        .ok()
        .json();
    let viewer = created["token"].as_str().unwrap().to_string();
    let (live, ready) = crate::support::serve_api(&sandbox).await;
    let url = ready["url"].as_str().unwrap().to_string();
    (sandbox, live, url, viewer)
}

/// A connection from the attacker's address.
async fn from_attacker(url: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let addr = url.trim_start_matches("http://").parse().unwrap();
    socket.connect(addr).await.unwrap()
}

/// An authenticated request from 127.0.0.1; answers how long it took.
async fn authenticated_get(url: &str, viewer: &str) -> Duration {
    let started = Instant::now();
    let answer = tokio::time::timeout(
        WAIT,
        reqwest::Client::new()
            .get(format!("{url}/v1/runs"))
            .bearer_auth(viewer)
            .send(),
    )
    .await
    .expect("an answer within the bound")
    .expect("the server answers");
    assert_eq!(answer.status(), 200);
    started.elapsed()
}

/// Everything the server sends until it closes the connection.
async fn answer_of(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut seen)).await;
    assert!(read.is_ok(), "the server closed the connection in time");
    String::from_utf8_lossy(&seen).into_owned()
}

/// The error code of a JSON error answer.
fn code_of(answer: &str) -> String {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let body: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    body["error"]["code"].as_str().unwrap_or("?").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_cap_of_slow_sign_ins_from_one_address_leave_room_for_an_authenticated_request() {
    let (_sandbox, live, url, viewer) = served().await;
    let mut attackers = Vec::new();
    for _ in 0..2 * CAP {
        let mut stream = from_attacker(&url).await;
        // A sign-in form that promises 100 bytes and sends one.
        stream
            .write_all(b"POST /console/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 100\r\n\r\nt")
            .await
            .unwrap();
        attackers.push(stream);
    }
    let took = authenticated_get(&url, &viewer).await;
    eprintln!(
        "an authenticated request behind {} slow sign-ins answered in {took:?}",
        2 * CAP
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // The address's share waited for its bodies until the body-read timeout (408); the
    // rest were turned away at once (503). All in our error shape.
    let mut codes = Vec::new();
    for stream in &mut attackers {
        let answer = answer_of(stream).await;
        codes.push(code_of(&answer));
    }
    let timed_out = codes.iter().filter(|c| *c == "request_timeout").count();
    let turned_away = codes
        .iter()
        .filter(|c| *c == "too_many_connections")
        .count();
    assert_eq!(
        (timed_out, turned_away),
        (SHARE, 2 * CAP - SHARE),
        "{codes:?}"
    );
    live.signal("KILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_cap_of_half_open_connections_from_one_address_leave_room_for_an_authenticated_request()
 {
    let (_sandbox, live, url, viewer) = served().await;
    let mut attackers = Vec::new();
    for _ in 0..2 * CAP {
        let mut stream = from_attacker(&url).await;
        stream.write_all(b"GET /v1/ru").await.unwrap();
        attackers.push(stream);
    }
    let took = authenticated_get(&url, &viewer).await;
    eprintln!(
        "an authenticated request behind {} half-open connections answered in {took:?}",
        2 * CAP
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // Every half-open connection is closed: at once over the share, after the header-read
    // timeout within it.
    for stream in &mut attackers {
        answer_of(stream).await;
    }
    live.signal("KILL");
}

/// Sends `head` and then `body_len` bytes of body in full before reading anything, as
/// Python's `http.client` does; answers what the server sent.
async fn send_all_then_read(url: &str, head: &str, body_len: usize) -> String {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut left = body_len;
    let sent = tokio::time::timeout(WAIT, async {
        while left > 0 {
            let n = left.min(chunk.len());
            stream.write_all(&chunk[..n]).await?;
            left -= n;
        }
        std::io::Result::Ok(())
    })
    .await
    .expect("the server drains the body in time");
    assert!(
        sent.is_ok(),
        "the whole body was taken, not reset: {sent:?}"
    );
    answer_of(&mut stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_body_sent_before_reading_still_gets_the_413_in_our_error_shape() {
    let (_sandbox, live, url, viewer) = served().await;
    const TEN_MB: usize = 10 * 1024 * 1024;
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {viewer}\r\ncontent-type: application/json\r\ncontent-length: {TEN_MB}\r\n\r\n"
    );
    let started = Instant::now();
    let answer = send_all_then_read(&url, &head, TEN_MB).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(code_of(&answer), "body_too_large", "{answer}");
    eprintln!(
        "a 10 MB body was drained and answered 413 in {:?}",
        started.elapsed()
    );

    // The sign-in form has a limit of its own, a few KiB; chunked, with no length given.
    let head = "POST /console/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\ntransfer-encoding: chunked\r\n\r\n";
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 8192, "t".repeat(8192));
    stream.write_all(chunk.as_bytes()).await.unwrap();
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let answer = answer_of(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("larger than 4096 bytes"), "{answer}");
    live.signal("KILL");
}
