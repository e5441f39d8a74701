//! A network hop between the workers and PostgreSQL, for the model of many nodes: a TCP
//! proxy on 127.0.0.1 that forwards every byte after a fixed delay in each direction
//! (`BENCH_PG_DELAY_US`, one way), keeping each direction's order. On one machine the
//! workers reach the database in tens of microseconds; on a cluster they are a network hop
//! away, and the audit chain's lock is held across that hop.
//!
//! Plain threads: each direction of a connection has a reader that stamps each chunk with
//! the instant it may leave, and a writer that waits for that instant. A sleeping thread
//! wakes up to about 100 us late (the kernel's timer slack), so the round trip the bench
//! reports is measured through the proxy, not assumed.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The one-way delay asked for with `BENCH_PG_DELAY_US`, if any.
pub(crate) fn asked() -> Option<Duration> {
    let us: u64 = std::env::var("BENCH_PG_DELAY_US").ok()?.parse().ok()?;
    (us > 0).then(|| Duration::from_micros(us))
}

/// Starts the proxy in front of `upstream` and returns the port it listens on. It runs
/// until the bench process ends.
pub(crate) fn start(upstream: SocketAddr, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the delay proxy");
    let port = listener.local_addr().expect("a bound address").port();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(upstream) else {
                continue;
            };
            for stream in [&client, &server] {
                stream.set_nodelay(true).expect("TCP_NODELAY");
            }
            let (client2, server2) = (
                client.try_clone().expect("a second handle"),
                server.try_clone().expect("a second handle"),
            );
            carry(client, server, delay);
            carry(server2, client2, delay);
        }
    });
    port
}

/// Forwards what `from` sends to `to`, each chunk `delay` after it arrived.
fn carry(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// The round trip of `SELECT 1` through `url`, p50 and p99 of 200, in microseconds.
pub(crate) fn round_trip(runtime: &tokio::runtime::Runtime, url: &str) -> (f64, f64) {
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connecting through the delay proxy");
        tokio::spawn(connection);
        let statement = client.prepare("SELECT 1").await.expect("prepared");
        let mut samples = Vec::with_capacity(200);
        for _ in 0..200 {
            let started = Instant::now();
            client.query_one(&statement, &[]).await.expect("SELECT 1");
            samples.push(started.elapsed().as_secs_f64() * 1e6);
        }
        samples.sort_by(f64::total_cmp);
        (samples[100], samples[198])
    })
}
