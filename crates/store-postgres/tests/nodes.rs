//! Several nodes (several `PgStore`s, each with its own pool and listener) on one
//! database: migrations applied once, claims won once, one audit chain, and every node
//! hearing every change.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use runwarden_runtime::RetryDecision;
use runwarden_runtime::migrations::MIGRATIONS;
use runwarden_runtime::queue::{Claim, QueueStore, RequeueAnswer, RequeueApply};
use runwarden_runtime::store::{EventAppend, NewRunStatus, RunCreate, RunStore};
use runwarden_runtime::{Change, RunState};
use runwarden_vault::audit::{AuditEvent, action};
use runwarden_vault::{Algorithm, MasterKey, Vault};
use serde_json::json;

use crate::common::{TestDb, now_ms};

#[tokio::test(flavor = "multi_thread")]
async fn nodes_starting_together_apply_each_migration_once() {
    let db = TestDb::new().await;
    let starts = (0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move { runwarden_store_postgres::PgStore::connect(&url).await })
    });
    for start in starts {
        start
            .await
            .unwrap()
            .expect("every node starts while the others migrate");
    }
    let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let names: Vec<String> = client
        .query("SELECT name FROM schema_migrations ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let listed: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
    assert_eq!(names, listed);
}

/// R3: 200 queued runs, three nodes, many claimants each: every run is claimed exactly
/// once and none is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_queued_run_is_claimed_exactly_once_by_racing_nodes() {
    const RUNS: usize = 200;
    let db = TestDb::new().await;
    let nodes = [db.node().await, db.node().await, db.node().await];
    let t0 = now_ms();
    for n in 0..RUNS {
        nodes[0]
            .run_create(RunCreate {
                id: format!("run-{n:04}"),
                agent: "helpdesk".into(),
                correlation: format!("run-{n:04}"),
                request: Some(json!({"input": n})),
                status: NewRunStatus::Queued,
                now_ms: t0,
                origin: Default::default(),
            })
            .await
            .unwrap();
    }
    let mut claimants = Vec::new();
    for (node_index, node) in nodes.iter().enumerate() {
        for worker in 0..8 {
            let node = Arc::clone(node);
            claimants.push(tokio::spawn(async move {
                let owner = format!("node-{node_index}-worker-{worker}");
                let mut won = Vec::new();
                loop {
                    let claim = Claim {
                        owner: owner.clone(),
                        lease_until_ms: t0 + 60_000,
                        now_ms: t0 + 1,
                        agents: None,
                        start: false,
                    };
                    match node.run_claim(claim).await.expect("run_claim") {
                        Some(run) => {
                            assert_eq!(run.claimed_by.as_deref(), Some(owner.as_str()));
                            won.push(run.id);
                        }
                        None => return won,
                    }
                }
            }));
        }
    }
    let mut all = Vec::new();
    for claimant in claimants {
        all.extend(claimant.await.unwrap());
    }
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(
        all.len(),
        RUNS,
        "every run claimed once, no run claimed twice"
    );
    assert_eq!(distinct.len(), RUNS);
    let counts = nodes[1].run_counts().await.unwrap();
    assert_eq!(counts, vec![(RunState::Running, RUNS as u64)]);
}

/// V7: writers on two nodes, many tasks each, extend one chain: ids contiguous, every row
/// linked, the tip and both nodes' anchor files agreeing, so `audit verify` finds it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_appending_concurrently_extend_one_chain_that_verifies() {
    const TASKS: usize = 16;
    const ROWS: usize = 10;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    // Both nodes load the same master key, as two machines with one key file would.
    let key_file = dir.path().join("master.key");
    MasterKey::generate().write_new_file(&key_file).unwrap();
    let master = || MasterKey::from_file(&key_file).unwrap();
    let vault_a = Vault::open(db.node().await, master(), Algorithm::default())
        .await
        .unwrap()
        .with_anchor(dir.path().join("a.anchor"));
    let vault_b = Vault::open(db.node().await, master(), Algorithm::default())
        .await
        .unwrap()
        .with_anchor(dir.path().join("b.anchor"));
    vault_a.audit_adopt_anchor().await.unwrap();
    vault_b.audit_adopt_anchor().await.unwrap();
    let (vault_a, vault_b) = (Arc::new(vault_a), Arc::new(vault_b));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let vault = Arc::clone(if task % 2 == 0 { &vault_a } else { &vault_b });
        tasks.push(tokio::spawn(async move {
            for row in 0..ROWS {
                vault
                    .audit_record(audit_event(task, row))
                    .await
                    .expect("audit_record");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let expected = (TASKS * ROWS) as i64;
    for vault in [&vault_a, &vault_b] {
        let report = vault.audit_verify().await.unwrap();
        assert!(report.intact, "{report:?}");
        assert_eq!(report.rows_verified, expected);
        let anchored = report.anchored_rows.expect("the anchor file was read");
        assert!(
            anchored > 0 && anchored <= expected,
            "the anchor records a synced length: {anchored}"
        );
    }
}

fn audit_event(task: usize, row: usize) -> AuditEvent {
    AuditEvent {
        time_ms: now_ms(),
        action: action::HTTP_CALL.into(),
        success: true,
        secret: Some("api_key".into()),
        method: "GET".into(),
        host: "api.example.com".into(),
        path: format!("/tasks/{task}/rows/{row}"),
        status: 200,
        duration_ms: 3,
        error: None,
        reason: None,
        actor: format!("node-{}", task % 2),
        correlation: Some(format!("run-{task}")),
        intent_id: None,
    }
}

/// O6: a change committed on one node reaches the feed of another node (NOTIFY), and the
/// cancel of a run in flight there is heard within the wait.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_on_one_node_reaches_another_nodes_feed() {
    let db = TestDb::new().await;
    let (a, b) = (db.node().await, db.node().await);
    let mut feed_b = b.change_feed().subscribe();
    let t0 = now_ms();
    a.run_create(RunCreate {
        id: "cross-1".into(),
        agent: "helpdesk".into(),
        correlation: "cross-1".into(),
        request: None,
        status: NewRunStatus::Running {
            owner: "node-b".into(),
            lease_until_ms: t0 + 30_000,
        },
        now_ms: t0,
        origin: Default::default(),
    })
    .await
    .unwrap();
    a.run_cancel("cross-1", t0 + 1).await.unwrap();
    let expected = [
        Change::Status {
            run_id: "cross-1".into(),
            status: RunState::Running,
        },
        Change::Status {
            run_id: "cross-1".into(),
            status: RunState::Cancelled,
        },
    ];
    for change in expected {
        let got = tokio::time::timeout(Duration::from_secs(5), feed_b.recv())
            .await
            .expect("node B hears node A's change within 5 s")
            .unwrap();
        assert_eq!(got, change);
    }
    assert_eq!(
        b.run_statuses(&["cross-1".to_owned()]).await.unwrap(),
        vec![("cross-1".to_owned(), RunState::Cancelled)],
        "the store, read on B, agrees with what B heard"
    );
}

/// R1: appenders on two nodes, many tasks each, writing to one run: every append gets its
/// own sequence number and together they are exactly 1..=N.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appenders_on_two_nodes_never_share_an_event_sequence() {
    const TASKS: usize = 12;
    const EVENTS: usize = 10;
    let db = TestDb::new().await;
    let nodes = [db.node().await, db.node().await];
    let t0 = now_ms();
    nodes[0]
        .run_create(RunCreate {
            id: "seq-1".into(),
            agent: "helpdesk".into(),
            correlation: "seq-1".into(),
            request: None,
            status: NewRunStatus::Running {
                owner: "segment".into(),
                lease_until_ms: t0 + 60_000,
            },
            now_ms: t0,
            origin: Default::default(),
        })
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let node = Arc::clone(&nodes[task % 2]);
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for n in 0..EVENTS {
                let seq = node
                    .run_event_append(EventAppend {
                        id: "seq-1".into(),
                        owner: "segment".into(),
                        epoch: 1,
                        kind: "tool_executed".into(),
                        payload: json!({"task": task, "n": n}),
                        clear_fence: false,
                        round: None,
                        end: None,
                        now_ms: t0 + 1,
                        before: None,
                    })
                    .await
                    .expect("run_event_append")
                    .expect("the owner may append");
                seqs.push(seq);
            }
            seqs
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort_unstable();
    let expected: Vec<i64> = (1..=(TASKS * EVENTS) as i64).collect();
    assert_eq!(all, expected, "no sequence taken twice, none skipped");
    let stored: Vec<i64> = nodes[1]
        .run_events("seq-1", 0, 0)
        .await
        .unwrap()
        .iter()
        .map(|event| event.seq)
        .collect();
    assert_eq!(stored, expected);
}

/// A call that answers without changing a row (a refused requeue: its guard matched
/// nothing) holds no lock after it answers: the very next claim, on another pooled
/// connection, finds the run instead of skipping it as locked.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_call_releases_its_row_lock_before_it_answers() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let t0 = now_ms();
    for n in 0..50 {
        let id = format!("lock-{n}");
        store
            .run_create(RunCreate {
                id: id.clone(),
                agent: "helpdesk".into(),
                correlation: id.clone(),
                request: Some(json!({"input": n})),
                status: NewRunStatus::Queued,
                now_ms: t0,
                origin: Default::default(),
            })
            .await
            .unwrap();
        let refused = store
            .run_requeue_apply(RequeueApply {
                id: id.clone(),
                owner: "not-the-owner".into(),
                epoch: 0,
                requeue_count: 0,
                pending_effect: None,
                decision: RetryDecision::Requeue { retry_at_ms: t0 },
                reason: "test".into(),
                counts: true,
                now_ms: t0,
            })
            .await
            .unwrap();
        assert_eq!(refused, RequeueAnswer::LeaseLost);
        let claimed = store
            .run_claim(Claim {
                owner: "worker".into(),
                lease_until_ms: t0 + 60_000,
                now_ms: t0,
                agents: None,
                start: false,
            })
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id} was skipped as locked after a refused requeue"));
        assert_eq!(claimed.id, id);
    }
}

/// O6: the time from a cancel called on node A to node B's feed announcing it, over 200
/// runs (the cross-node half of R6's wake-up). Prints the distribution; the bound is
/// loose (a debug build on a shared machine) and only catches a poll in disguise.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_on_one_node_is_announced_on_another_within_milliseconds() {
    const RUNS: usize = 200;
    let db = TestDb::new().await;
    let (a, b) = (db.node().await, db.node().await);
    let t0 = now_ms();
    for n in 0..RUNS {
        a.run_create(RunCreate {
            id: format!("lat-{n}"),
            agent: "helpdesk".into(),
            correlation: format!("lat-{n}"),
            request: None,
            status: NewRunStatus::Running {
                owner: "node-b".into(),
                lease_until_ms: t0 + 60_000,
            },
            now_ms: t0,
            origin: Default::default(),
        })
        .await
        .unwrap();
    }
    let mut feed = b.change_feed().subscribe();
    let mut samples = Vec::with_capacity(RUNS);
    for n in 0..RUNS {
        let id = format!("lat-{n}");
        let expected = Change::Status {
            run_id: id.clone(),
            status: RunState::Cancelled,
        };
        let started = std::time::Instant::now();
        a.run_cancel(&id, t0 + 1).await.unwrap();
        let heard = async {
            loop {
                if feed.recv().await.unwrap() == expected {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), heard)
            .await
            .expect("node B hears the cancel");
        samples.push(started.elapsed());
    }
    let dist = runwarden_testkit::Dist::new(samples);
    println!(
        "cancel on node A -> Change::Status(cancelled) on node B's feed, {RUNS} runs: p50 {:?} p99 {:?} max {:?}",
        dist.pct(50.0),
        dist.pct(99.0),
        dist.max()
    );
    assert!(
        dist.pct(99.0) < Duration::from_millis(250),
        "p99 {:?}",
        dist.pct(99.0)
    );
}

/// R6 (amended): a cancel written on node A reaches a call watched on node B through
/// NOTIFY, at once. B's watcher refreshes only hourly here, so nothing but the
/// notification can wake it, and B's process never cancelled anything.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_on_one_node_wakes_a_call_watched_on_another_at_once() {
    use runwarden_runtime::{CancelAnswer, CancelHub, StatusWatcher, WatcherConfig};
    use runwarden_vault::CancellationSignal;

    let db = TestDb::new().await;
    let (a, b) = (db.node().await, db.node().await);
    let id = "watched-across-nodes".to_string();
    a.run_create(RunCreate {
        id: id.clone(),
        agent: "helper".into(),
        correlation: id.clone(),
        request: None,
        status: NewRunStatus::Running {
            owner: "node-b".into(),
            lease_until_ms: now_ms() + 30_000,
        },
        now_ms: now_ms(),
        origin: Default::default(),
    })
    .await
    .unwrap();
    let watcher = StatusWatcher::new(
        b.clone(),
        Arc::new(CancelHub::new()),
        WatcherConfig {
            interval: Duration::from_secs(3600),
        },
    );
    let signal = watcher.signal(&id).await;
    assert!(!signal.is_cancelled());
    let woken = signal.woken();
    let issued = std::time::Instant::now();
    assert!(matches!(
        a.run_cancel(&id, now_ms()).await.unwrap(),
        CancelAnswer::Cancelled { .. }
    ));
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .expect("node A's NOTIFY wakes the call on node B");
    let took = issued.elapsed();
    assert!(signal.is_cancelled(), "the row, read on B, says cancelled");
    // Generous bound: a notification takes milliseconds; the refresh would take an hour.
    assert!(took < Duration::from_secs(2), "took {took:?}");
}
