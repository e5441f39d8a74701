//! PostgreSQL faults on the wire, between two `runwarden worker` processes and a real
//! server: a TCP proxy written here, on 127.0.0.1, carries every byte between them and
//! injects, one case after another on the same two workers: (a) backends terminated by
//! the server (`pg_terminate_backend`), (b) the link cut right after a COMMIT went through,
//! (c) connections that stop carrying the server's answers but stay open (a hung backend,
//! a half-open link).
//!
//! For each case, runs are enqueued (straight to the server, past the proxy) while the
//! fault is on; each run's one step is a non-idempotent write to the counting MCP server.
//! Then: no write reaches the server twice; what each run's log records is what the
//! server saw (a stored write step means one write, a completed run means a stored write,
//! no write stored means none sent unless the run is failed as an unknown outcome); every
//! run is terminal within [`SETTLE`] of the fault's end; each run's row matches its log;
//! the ended runs' counts kept for metrics match the rows; both workers are still running,
//! and they exit cleanly at the end. Waits are on the store's own change notifications,
//! each with a timeout.
//!
//! A second test stops the server itself hard (`pg_ctl stop -m immediate`, as a crash)
//! while runs are in flight and starts it again, on a cluster of its own so no other test
//! sees the restart: every run ends after it, and the server saw exactly one write per run
//! (none for a run failed as an unknown outcome, fenced just before the stop).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runwarden_testkit::TempCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::support::Live as Child;
use crate::support::Sandbox;
use crate::support::workers::{Install, install_in, write_agents};

/// Runs enqueued while each fault is on.
const RUNS_PER_CASE: usize = 8;
/// How long each fault stays on.
const FAULT: Duration = Duration::from_secs(3);
/// The bound within which every run of a case is terminal once its fault is off: a lease
/// to run out, a reaper pass, a store call's deadline and a few retries, with room for a
/// loaded machine.
const SETTLE: Duration = Duration::from_secs(45);
/// Leases and bounds short enough that every recovery path runs within seconds: a store
/// call gives up after 2 s (a hung link), the server cancels a statement after 1 s.
const SETTINGS: &str = "lease_seconds = 3.0\nheartbeat_seconds = 0.5\nreap_seconds = 0.3\nretry_base_seconds = 0.05\ngrace_seconds = 5\n";
const STORE_BOUNDS: &str =
    "statement_timeout_seconds = 1\ncall_timeout_seconds = 2\npool_wait_seconds = 1\n";

/// What the proxy does to the connections passing through it.
#[derive(Default)]
struct Faults {
    /// COMMITs still to cut: the message goes through, then both sides are closed.
    cuts_left: AtomicUsize,
    /// Connections still to hang: the next ones to send anything stop receiving the
    /// server's answers (they are read and dropped) but stay open.
    hangs_left: AtomicUsize,
    cut: AtomicUsize,
    hung: AtomicUsize,
    connections: AtomicUsize,
}

/// Accepts on 127.0.0.1 and forwards each connection to `upstream`, applying [`Faults`].
async fn proxy(upstream: u16) -> (u16, Arc<Faults>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let faults = Arc::new(Faults::default());
    let shared = faults.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            shared.connections.fetch_add(1, Ordering::SeqCst);
            let faults = shared.clone();
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                    carry(client, server, &faults).await;
                }
            });
        }
    });
    (port, faults)
}

/// One connection's bytes, both ways, until either side closes or a fault cuts it.
async fn carry(mut client: TcpStream, mut server: TcpStream, faults: &Faults) {
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let hung = AtomicBool::new(false);
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
                let sent = &up[..n];
                if !hung.load(Ordering::SeqCst) && take(&faults.hangs_left) {
                    hung.store(true, Ordering::SeqCst);
                    faults.hung.fetch_add(1, Ordering::SeqCst);
                }
                let commit = sent.windows(6).any(|w| w.eq_ignore_ascii_case(b"COMMIT"));
                if commit && take(&faults.cuts_left) {
                    faults.cut.fetch_add(1, Ordering::SeqCst);
                    let _ = server.flush().await;
                    return; // both sockets close: the answer to the COMMIT is lost
                }
            }
            read = server.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if !hung.load(Ordering::SeqCst) && client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Takes one from a budget; false when it is spent.
fn take(budget: &AtomicUsize) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// The port of a `postgres://user@127.0.0.1:PORT/db` URL.
fn port_of(url: &str) -> u16 {
    let rest = url.rsplit_once(':').unwrap().1;
    rest.split('/').next().unwrap().parse().unwrap()
}

/// A direct connection to the test database (past the proxy) and the store's change
/// notifications on it.
async fn direct(url: &str) -> (tokio_postgres::Client, mpsc::UnboundedReceiver<()>) {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(_) = message {
                let _ = tx.send(());
            }
        }
    });
    client
        .batch_execute("LISTEN runwarden_changes")
        .await
        .unwrap();
    (client, rx)
}

/// One run as the store and the server see it at the end.
#[derive(Debug)]
struct Seen {
    status: String,
    reason: Option<String>,
    /// The write's recorded steps: `tool_executed` and `effect_uncertain` events.
    steps: usize,
    uncertain: usize,
    last_kind: Option<String>,
    writes: usize,
    /// Whether the row's status matches the log's final event.
    row_and_log: Result<(), String>,
}

/// Asserts that the ended runs' counts the store keeps for metrics (the counts and the
/// changes not moved into them yet) match the rows, counted one by one: each change of a
/// run's state and its count commit together or not at all.
async fn assert_ended_counts_match_rows(db: &tokio_postgres::Client, case: &str) {
    let read = |sql: &'static str| async move {
        db.query(sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
            .collect::<BTreeMap<_, _>>()
    };
    let kept = read(
        "SELECT status, SUM(n)::BIGINT FROM (SELECT status, n FROM run_counts
             UNION ALL SELECT status, n FROM run_count_changes) AS kept
         GROUP BY status HAVING SUM(n) <> 0",
    )
    .await;
    let rows = read(
        "SELECT status, COUNT(*) FROM runs WHERE status IN ('completed', 'failed', 'cancelled')
         GROUP BY status",
    )
    .await;
    assert_eq!(
        kept, rows,
        "case {case}: the ended runs' counts match the rows"
    );
}

/// The runs among `ids` (by id, with their agent's index) not yet terminal.
async fn unfinished(db: &tokio_postgres::Client, ids: &BTreeMap<String, usize>) -> usize {
    let list: Vec<String> = ids.keys().cloned().collect();
    let row = db
        .query_one(
            "SELECT COUNT(*) FROM runs WHERE id = ANY($1)
                 AND status NOT IN ('completed', 'failed', 'cancelled')",
            &[&list],
        )
        .await
        .unwrap();
    usize::try_from(row.get::<_, i64>(0)).unwrap()
}

async fn seen(db: &tokio_postgres::Client, id: &str, k: usize, install: &Install) -> Seen {
    let row = db
        .query_one(
            "SELECT status, termination_reason FROM runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let kinds: Vec<String> = db
        .query(
            "SELECT kind FROM run_events WHERE run_id = $1 ORDER BY seq",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let status: String = row.get(0);
    let row_and_log = match runwarden_runtime::RunState::parse(&status) {
        Some(state) => {
            let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
            runwarden_runtime::check_row_matches_log(id, state, &kinds)
        }
        None => Err(format!("run {id}: unknown status {status}")),
    };
    Seen {
        status,
        reason: row.get(1),
        steps: kinds.iter().filter(|k| *k == "tool_executed").count(),
        uncertain: kinds.iter().filter(|k| *k == "effect_uncertain").count(),
        last_kind: kinds.last().cloned(),
        writes: install.calls.of("create", &format!("answer {k}")),
        row_and_log,
    }
}

/// Checks one run against what the server saw; answers whether it ended as an unknown
/// outcome (failed with its fence in place).
#[track_caller]
fn check(case: &str, id: &str, run: &Seen) -> bool {
    let at = format!("case {case}, run {id}: {run:?}");
    assert!(run.writes <= 1, "at most once: {at}");
    assert!(run.row_and_log.is_ok(), "the row matches the log: {at}");
    assert!(
        run.steps + run.uncertain <= 1,
        "one recorded write step: {at}"
    );
    let reason = run.reason.as_deref().unwrap_or_default();
    let unknown = run.status == "failed"
        && (reason.starts_with("FENCED_WRITE") || reason.starts_with("EFFECT_UNCERTAIN"));
    if run.steps == 1 {
        assert_eq!(
            run.writes, 1,
            "a stored write step is a write the server saw: {at}"
        );
    }
    if run.status == "completed" {
        assert_eq!(run.steps, 1, "a completed run's write is stored: {at}");
        assert_eq!(
            run.last_kind.as_deref(),
            Some("run_completed"),
            "the row and the log agree: {at}"
        );
    }
    if run.steps == 0 && run.uncertain == 0 && !unknown {
        assert_eq!(
            run.writes, 0,
            "no write recorded and no unknown outcome: none sent: {at}"
        );
    }
    unknown
}

/// Waits, on the store's change notifications, until every run of `ids` is terminal;
/// fails after [`SETTLE`] showing the rows and what the workers wrote to stderr.
async fn until_terminal(
    db: &tokio_postgres::Client,
    changes: &mut mpsc::UnboundedReceiver<()>,
    ids: &BTreeMap<String, usize>,
    workers: &mut [Child],
    case: &str,
) {
    let since = Instant::now();
    while unfinished(db, ids).await > 0 {
        let left = SETTLE.saturating_sub(since.elapsed());
        if tokio::time::timeout(left, changes.recv()).await.is_ok() {
            continue;
        }
        let mut open = Vec::new();
        for id in ids.keys() {
            let row = db
                .query_one(
                    "SELECT status, termination_reason, claimed_by FROM runs WHERE id = $1",
                    &[id],
                )
                .await
                .unwrap();
            open.push(format!(
                "{id}: {} {:?} {:?}",
                row.get::<_, String>(0),
                row.get::<_, Option<String>>(1),
                row.get::<_, Option<String>>(2)
            ));
        }
        let mut logs = Vec::new();
        for worker in workers.iter_mut() {
            let exited = worker.has_exited();
            let said = last_lines(worker);
            logs.push(format!("worker {} exited: {exited}\n{said}", worker.pid));
        }
        panic!(
            "case {case}: runs not terminal {SETTLE:?} after the fault:\n{}\n{}",
            open.join("\n"),
            logs.join("\n")
        );
    }
}

/// `enqueue --agent pK write` straight to the server; the run id.
async fn enqueue_direct(sandbox: &Arc<Sandbox>, direct_url: &str, agent: String) -> String {
    let (sandbox, url) = (sandbox.clone(), direct_url.to_string());
    tokio::task::spawn_blocking(move || {
        let mut command = sandbox.command(&["enqueue", "--agent", &agent, "write"]);
        // Its own application name: the fault of case (a) terminates only the workers'.
        command.env(
            "RUNWARDEN_DATABASE_URL",
            format!("{url}?application_name=runwarden-test"),
        );
        let out = sandbox.run_command(command).ok();
        let id = out.stdout.trim().to_string();
        assert_eq!(id.len(), 36, "enqueue prints the run id: {out:#?}");
        id
    })
    .await
    .unwrap()
}

/// Terminates every runwarden backend of the database but the caller's, every 100 ms,
/// until `until`; answers how many were terminated.
async fn terminate_backends(db: &tokio_postgres::Client, until: Instant) -> i64 {
    let mut total = 0;
    while Instant::now() < until {
        let row = db
            .query_one(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                     AND application_name = 'runwarden'",
                &[],
            )
            .await
            .unwrap();
        total += row.get::<_, i64>(0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    total
}

/// An initialised sandbox on the PostgreSQL database at `url`, with the store's bounds
/// (`STORE_BOUNDS`) in its `[store]` section.
async fn bounded_sandbox_on(url: &str) -> Sandbox {
    let sandbox = {
        let url = url.to_string();
        tokio::task::spawn_blocking(move || Sandbox::initialised_on(&url))
            .await
            .unwrap()
    };
    let text = std::fs::read_to_string(sandbox.config()).unwrap();
    std::fs::write(
        sandbox.config(),
        text.replace("\n[store]\n", &format!("\n[store]\n{STORE_BOUNDS}")),
    )
    .unwrap();
    sandbox
}

/// A fresh database, the proxy in front of it, and an installation whose store URL goes
/// through the proxy (with short store bounds); answers the direct URL as well.
async fn installed_behind_a_proxy(cluster: &TempCluster) -> (Install, Arc<Faults>, String) {
    let direct_url = cluster.fresh_database().await;
    let (port, faults) = proxy(port_of(&direct_url)).await;
    let proxied_url =
        direct_url.replace(&format!(":{}/", port_of(&direct_url)), &format!(":{port}/"));
    let sandbox = bounded_sandbox_on(&proxied_url).await;
    let agents = write_agents("p", "answer", RUNS_PER_CASE * 3);
    let install = install_in(sandbox, SETTINGS, &agents).await;
    (install, faults, direct_url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_through_a_faulty_link_write_at_most_once_and_recover_without_a_restart() {
    let started = Instant::now();
    let cluster = TempCluster::start();
    let (install, faults, direct_url) = installed_behind_a_proxy(&cluster).await;
    let (db, mut changes) = direct(&direct_url).await;
    let mut workers: Vec<Child> = (0..2)
        .map(|_| Child::worker(&install.sandbox, Some(3)))
        .collect();

    // Both workers are up (connected, migrated, claiming) before the first fault: a
    // warm-up run each is claimed and completed.
    let warm_up: BTreeMap<String, usize> = [
        enqueue_direct(&install.sandbox, &direct_url, "quick".into()).await,
        enqueue_direct(&install.sandbox, &direct_url, "quick".into()).await,
    ]
    .into_iter()
    .map(|id| (id, usize::MAX))
    .collect();
    until_terminal(&db, &mut changes, &warm_up, &mut workers, "warm-up").await;

    let mut next_agent = 0;
    let mut figures = Vec::new();
    for case in [
        "backends terminated",
        "cut after COMMIT",
        "hung connections",
    ] {
        let on = Instant::now();
        match case {
            "cut after COMMIT" => faults.cuts_left.store(40, Ordering::SeqCst),
            "hung connections" => faults.hangs_left.store(6, Ordering::SeqCst),
            _ => {}
        }
        let enqueues = async {
            let mut ids = BTreeMap::new();
            for _ in 0..RUNS_PER_CASE {
                let k = next_agent;
                next_agent += 1;
                let id = enqueue_direct(&install.sandbox, &direct_url, format!("p{k}")).await;
                ids.insert(id, k);
            }
            ids
        };
        let (ids, terminated) = if case == "backends terminated" {
            tokio::join!(enqueues, terminate_backends(&db, on + FAULT))
        } else {
            let ids = enqueues.await;
            tokio::time::sleep(FAULT.saturating_sub(on.elapsed())).await;
            (ids, 0)
        };
        faults.cuts_left.store(0, Ordering::SeqCst);
        faults.hangs_left.store(0, Ordering::SeqCst);
        let off = Instant::now();
        until_terminal(&db, &mut changes, &ids, &mut workers, case).await;
        let settled = off.elapsed();
        let (mut completed, mut unknown, mut unknown_unsent) = (0, 0, 0);
        let mut others = Vec::new();
        for (id, k) in &ids {
            let run = seen(&db, id, *k, &install).await;
            if check(case, id, &run) {
                unknown += 1;
                unknown_unsent += usize::from(run.writes == 0);
            } else if run.status != "completed" {
                let reason = run.reason.unwrap_or_default();
                others.push(format!(
                    "{} ({})",
                    run.status,
                    reason.chars().take(120).collect::<String>()
                ));
            }
            completed += usize::from(run.status == "completed");
        }
        for (w, worker) in workers.iter_mut().enumerate() {
            if let Some(report) = exited(worker).await {
                panic!("case {case}: worker {w} exited: {report}");
            }
        }
        assert_ended_counts_match_rows(&db, case).await;
        figures.push(format!(
            "case {case}: {} runs, {completed} completed, {unknown} failed as unknown ({unknown_unsent} of them never sent), \
             all terminal {settled:.1?} after the fault (bound {SETTLE:?}); terminated {terminated}, cut {}, hung {}; others: {others:?}",
            ids.len(),
            faults.cut.swap(0, Ordering::SeqCst),
            faults.hung.swap(0, Ordering::SeqCst),
        ));
    }
    let writes = install.calls.total("create");
    for line in &figures {
        println!("{line}");
    }
    println!(
        "3 cases, {} runs, {writes} writes seen by the server, {} connections through the proxy, {:.1?} in all",
        next_agent,
        faults.connections.load(Ordering::SeqCst),
        started.elapsed()
    );
    for (w, worker) in workers.iter_mut().enumerate() {
        let since = Instant::now();
        worker.signal("TERM");
        let ended = worker.ended(since, Duration::from_secs(10)).await;
        assert_eq!(ended.code, Some(0), "worker {w} exits cleanly: {ended:#?}");
    }
    drop(cluster);
}

/// Runs queued before the server restart.
const RESTART_RUNS: usize = 8;

/// Waits until the counting server has received its first `create` call.
async fn until_a_write_arrives(server: &mut runwarden_testkit::TestServer) {
    loop {
        let request = server.next_request(SETTLE).await;
        let body: serde_json::Value =
            serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
        if body["method"] == "tools/call" && body["params"]["name"] == "create" {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_across_a_server_restart_write_once_per_run_and_finish() {
    let started = Instant::now();
    // A cluster of this test's own: stopping the shared server would fail other tests.
    let mut cluster = TempCluster::start_owned();
    let url = cluster.fresh_database().await;
    let sandbox = bounded_sandbox_on(&url).await;
    let agents = write_agents("r", "answer", RESTART_RUNS);
    let mut install = install_in(sandbox, SETTINGS, &agents).await;
    // Queued before the workers start, so both claim at once and the stop finds runs at
    // every stage: claimed, fenced, sent, answered.
    let mut ids = BTreeMap::new();
    for k in 0..RESTART_RUNS {
        let id = enqueue_direct(&install.sandbox, &url, format!("r{k}")).await;
        ids.insert(id, k);
    }
    let mut workers: Vec<Child> = (0..2)
        .map(|_| Child::worker(&install.sandbox, Some(3)))
        .collect();
    until_a_write_arrives(&mut install.server).await;
    tokio::task::block_in_place(|| cluster.stop());
    let writes_while_up = install.calls.total("create");
    // The fault window: the server stays down longer than a lease.
    tokio::time::sleep(FAULT).await;
    tokio::task::block_in_place(|| cluster.restart());
    let back = Instant::now();
    let (db, mut changes) = direct(&url).await;
    until_terminal(&db, &mut changes, &ids, &mut workers, "server restart").await;
    let settled = back.elapsed();
    let mut statuses = BTreeMap::<String, usize>::new();
    for (id, k) in &ids {
        let run = seen(&db, id, *k, &install).await;
        // A run whose fence committed just before the stop, and whose audit intent did
        // not, was never sent; nothing recorded that, so its outcome stays unknown
        // (`FENCED_WRITE`): reported as unknown, never retried. Every other run wrote once.
        let unknown = check("server restart", id, &run);
        assert!(
            run.writes == 1 || unknown,
            "run {id}: the server saw exactly one write for it, or its outcome is unknown: {run:?}"
        );
        let reason = run.reason.as_deref().unwrap_or_default();
        let reason = reason.split(':').next().unwrap_or_default();
        *statuses
            .entry(format!("{} {reason}", run.status).trim().to_string())
            .or_default() += 1;
    }
    for (w, worker) in workers.iter_mut().enumerate() {
        if let Some(report) = exited(worker).await {
            panic!("worker {w} exited after the restart: {report}");
        }
    }
    assert_ended_counts_match_rows(&db, "server restart").await;
    // Nothing here scrapes metrics: the workers' reapers move every change on their own.
    until_no_change_is_left(&db).await;
    assert_ended_counts_match_rows(&db, "server restart, changes moved").await;
    println!(
        "server restart: {} runs, {} writes seen ({writes_while_up} before the stop), rows {statuses:?}, \
         all terminal {settled:.1?} after the restart (bound {SETTLE:?}), {:.1?} in all",
        ids.len(),
        install.calls.total("create"),
        started.elapsed()
    );
    for (w, worker) in workers.iter_mut().enumerate() {
        let since = Instant::now();
        worker.signal("TERM");
        let ended = worker.ended(since, Duration::from_secs(10)).await;
        assert_eq!(ended.code, Some(0), "worker {w} exits cleanly: {ended:#?}");
    }
}

/// Waits (reading every 20 ms, up to 10 s) until no ended run's change is left for the
/// counts; the workers' reapers, every 0.3 s here, move them.
async fn until_no_change_is_left(db: &tokio_postgres::Client) {
    let started = Instant::now();
    loop {
        let left: i64 = db
            .query_one("SELECT COUNT(*) FROM run_count_changes", &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{left} changes were never moved into the counts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The last 30 lines a worker wrote to stderr (what it said before it exited).
fn last_lines(worker: &mut Child) -> String {
    let mut lines = Vec::new();
    while let Ok(line) = worker.stderr.try_recv() {
        lines.push(line);
    }
    lines.split_off(lines.len().saturating_sub(30)).join("\n")
}

/// When `worker` has exited: its exit code and the rest of what it wrote (its pipes close
/// with it), for the failure message.
async fn exited(worker: &mut Child) -> Option<String> {
    let code = match worker.exit.try_recv() {
        Ok((code, _)) => code,
        Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return None,
        Err(tokio::sync::oneshot::error::TryRecvError::Closed) => None,
    };
    let rest = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        let mut lines = Vec::new();
        while let Ok(line) = rx.try_recv() {
            lines.push(line);
        }
        lines
    };
    // The readers forward the last lines after the exit is seen: let them.
    let mut stderr = rest(&mut worker.stderr);
    let mut stdout = rest(&mut worker.stdout);
    while let Ok(Some(line)) =
        tokio::time::timeout(Duration::from_secs(2), worker.stderr.recv()).await
    {
        stderr.push(line);
    }
    while let Ok(Some(line)) =
        tokio::time::timeout(Duration::from_secs(2), worker.stdout.recv()).await
    {
        stdout.push(line);
    }
    let tail = |lines: Vec<String>| lines[lines.len().saturating_sub(30)..].join("\n");
    Some(format!(
        "exit code {code:?}\nstderr:\n{}\nstdout:\n{}",
        tail(stderr),
        tail(stdout)
    ))
}
