//! O6 in one serving process, over a real SQLite file and real HTTP on 127.0.0.1: an idle
//! event stream and an idle worker make no store calls at all; the stream is pushed the
//! events the worker appends; a worker is woken by an enqueue rather than by a timer.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::queue::Claimed;
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{QueueStore, Run, RunState, RunStore, Worker, WorkerConfig};
use runwarden_testkit::{Call, Hook, HookedStore, StoreAnswer, Strike};
use runwarden_vault::{Role, token_create};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use super::listener::Limits;
use super::*;

/// Generous: only a missing wake-up or push fails it.
const WAIT: Duration = Duration::from_secs(10);
/// How long an idle stream and an idle worker are watched for store calls: six of the old
/// 100 ms stream polls and two of the old 250 ms worker polls.
const IDLE_WINDOW: Duration = Duration::from_millis(600);

/// The run store of the process, counting every call made through it.
type CountingStore = HookedStore<dyn QueueStore, Counting>;

/// Counts the calls made through the process's run store.
struct Counting {
    /// Every call, reads and writes alike, but the reaper's own (its pass runs on its own
    /// timer, idle or not) and the worker's presence beats.
    calls: watch::Sender<usize>,
    /// Claims that found nothing: the worker is about to idle.
    empty_claims: watch::Sender<usize>,
}

/// The calls not counted: the reaper's pass (its stale runs, their rescue, the
/// decisions' expiry sweep and the run counts' fold) and the worker's presence.
const UNCOUNTED: [&str; 8] = [
    "run_stale",
    "run_rescue_apply",
    "run_stopped_orphans",
    "decision_list",
    "run_counts_fold",
    "worker_seen",
    "worker_last_seen",
    "run_create_keyed",
];

impl Counting {
    fn new() -> Self {
        Self {
            calls: watch::channel(0).0,
            empty_claims: watch::channel(0).0,
        }
    }

    fn calls(&self) -> usize {
        *self.calls.borrow()
    }
}

#[async_trait]
impl Hook for Counting {
    async fn before(&self, call: &Call) -> Strike {
        if !UNCOUNTED.contains(&call.method) {
            self.calls.send_modify(|n| *n += 1);
        }
        Strike::Pass
    }

    async fn after(&self, call: &Call, answer: StoreAnswer<'_>) -> Option<StoreError> {
        // A worker claims a run for each free slot; a bare claim counts the same.
        let empty = match call.method {
            "run_claim" => matches!(
                answer
                    .result
                    .downcast_ref::<Result<Option<Run>, StoreError>>(),
                Some(Ok(None))
            ),
            "run_claim_many" => matches!(
                answer
                    .result
                    .downcast_ref::<Result<Vec<Claimed>, StoreError>>(),
                Some(Ok(claimed)) if claimed.is_empty()
            ),
            _ => false,
        };
        if empty {
            self.empty_claims.send_modify(|n| *n += 1);
        }
        None
    }
}

/// A serving process: the API on 127.0.0.1 over the root's store wrapped in [`Counting`].
struct Served {
    _dir: tempfile::TempDir,
    state: AppState,
    runs: Arc<CountingStore>,
    addr: std::net::SocketAddr,
    viewer: String,
    viewer_id: String,
    _stop: watch::Sender<StopLevel>,
    stop: watch::Receiver<StopLevel>,
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(
        &path,
        "[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    let config = Config::load(&path).unwrap();
    crate::installation::create_installation(&config)
        .await
        .unwrap();
    let root = Arc::new(Root::new(config));
    let (stop_tx, stop) = watch::channel(StopLevel::Run);
    let mut state = AppState::new(root.clone(), stop.clone()).await.unwrap();
    let runs: Arc<CountingStore> = Arc::new(HookedStore::new(state.runs.clone(), Counting::new()));
    state.runs = runs.clone();
    let (viewer, viewer_token) = token_create(&*state.tokens, "view", Role::Viewer, 0)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        max_connections: 64,
        max_connections_per_client: 64,
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
    };
    tokio::spawn(listener::serve(
        listener,
        router(state.clone()),
        limits,
        None,
        stop.clone(),
    ));
    Served {
        _dir: dir,
        state,
        runs,
        addr,
        viewer: viewer.expose().to_string(),
        viewer_id: viewer_token.id,
        _stop: stop_tx,
        stop,
    }
}

impl Served {
    async fn enqueue(&self) -> String {
        let id = uuid::Uuid::now_v7().to_string();
        self.runs
            .run_create(RunCreate {
                id: id.clone(),
                agent: "a".into(),
                correlation: id.clone(),
                request: Some(serde_json::json!({ "prompt": "go" })),
                status: NewRunStatus::Queued,
                now_ms: chrono::Utc::now().timestamp_millis(),
                origin: Default::default(),
            })
            .await
            .unwrap();
        id
    }

    /// A worker of this process over the counting store. Its backstop is a minute, so
    /// only the change feed can wake it within a test's bounds.
    fn worker(&self) -> Arc<Worker> {
        let config = WorkerConfig {
            concurrency: 2,
            poll: Duration::from_secs(60),
            reap_every: Duration::from_secs(3600),
            ..WorkerConfig::default()
        };
        Arc::new(Worker::new(
            self.state.executor.clone(),
            self.runs.clone(),
            self.state.agents.clone(),
            config,
        ))
    }

    /// Opens `GET /v1/runs/{id}/events` as SSE over a raw socket and returns it once the
    /// response head has arrived.
    async fn open_stream(&self, run_id: &str) -> tokio::net::TcpStream {
        let mut socket = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "GET /v1/runs/{run_id}/events HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\naccept: text/event-stream\r\n\r\n",
            self.addr, self.viewer
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let head = read_until(&mut socket, "\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        socket
    }
}

/// Reads from `socket` until `needle` has arrived, within [`WAIT`].
async fn read_until(socket: &mut tokio::net::TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(needle) {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended before {needle:?}");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{needle:?} did not arrive; got {}",
            String::from_utf8_lossy(&seen)
        )
    });
    String::from_utf8_lossy(&seen).into_owned()
}

/// Waits until `counter` reaches `at_least`, within [`WAIT`].
async fn reached(counter: &watch::Sender<usize>, at_least: usize) {
    let mut rx = counter.subscribe();
    tokio::time::timeout(WAIT, rx.wait_for(|n| *n >= at_least))
        .await
        .expect("reached in time")
        .expect("the counter lives");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_event_stream_makes_no_store_calls_and_is_pushed_what_a_worker_appends() {
    let served = serve().await;
    let run_id = served.enqueue().await;
    let mut stream = served.open_stream(&run_id).await;
    // The handler's existence check, then the stream's first read (events, then status).
    reached(&served.runs.calls, 4).await;
    let before = served.runs.calls();
    tokio::time::sleep(IDLE_WINDOW).await;
    assert_eq!(
        served.runs.calls(),
        before,
        "O6: an idle stream reads nothing (it used to read twice every 100 ms)"
    );
    // A worker of the same process claims and executes the run; its appends are pushed.
    let worker = tokio::spawn(served.worker().run(served.stop.clone()));
    let pushed = read_until(&mut stream, "event: run_completed").await;
    for kind in ["run_started", "model_response", "run_completed"] {
        assert!(pushed.contains(&format!("event: {kind}")), "{pushed}");
    }
    worker.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_worker_makes_no_store_calls_and_an_enqueue_wakes_it() {
    let served = serve().await;
    let worker = tokio::spawn(served.worker().run(served.stop.clone()));
    reached(&served.runs.empty_claims, 1).await; // nothing queued: it idles
    let before = served.runs.calls();
    tokio::time::sleep(IDLE_WINDOW).await;
    assert_eq!(
        served.runs.calls(),
        before,
        "O6: an idle worker does not poll the queue"
    );
    let mut feed = served.runs.change_feed().subscribe();
    let enqueued = Instant::now();
    let run_id = served.enqueue().await;
    // The backstop is a minute: a claim within the bound is the feed's wake-up.
    let claimed = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(runwarden_runtime::Change::Status {
                run_id: id,
                status: RunState::Running,
            }) = feed.recv().await
                && id == run_id
            {
                return enqueued.elapsed();
            }
        }
    })
    .await
    .expect("the enqueue woke the worker");
    eprintln!("enqueue to claim: {claimed:?}");
    assert!(claimed < Duration::from_secs(5), "{claimed:?}");
    worker.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_event_stream_ends_within_seconds_of_its_token_being_revoked() {
    let served = serve().await;
    let run_id = served.enqueue().await; // queued, no worker: the stream would stay open
    let mut stream = served.open_stream(&run_id).await;
    reached(&served.runs.calls, 4).await; // the stream's first read is done
    let revoked = Instant::now();
    assert!(
        served
            .state
            .tokens
            .token_revoke(&served.viewer_id)
            .await
            .unwrap()
    );
    // The chunked body's last chunk: the server ended the response (SSE data never
    // holds a CRLF, so this is the terminator).
    read_until(&mut stream, "0\r\n\r\n").await;
    let took = revoked.elapsed();
    eprintln!("a revoked token's stream ended {took:?} after the revocation");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
