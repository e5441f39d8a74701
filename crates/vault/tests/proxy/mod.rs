//! The sandbox's egress proxy (V10): a real listener on 127.0.0.1 as the proxy, real TCP
//! servers as targets, and a client speaking raw CONNECT and absolute-form requests.

mod lifecycle;
mod request;
mod tunnel;

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
