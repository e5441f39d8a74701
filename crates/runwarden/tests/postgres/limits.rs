//! R14 across nodes: two `runwarden worker` processes on one PostgreSQL database share one
//! concurrency limit, and the slot of a node killed with `kill -9` while it held it comes
//! back after the limit's lease, to a call waiting on the other node.

use std::time::{Duration, Instant};

use runwarden_testkit::TempCluster;

use crate::support::Live as Child;
use crate::support::workers::{
    Install, WAIT, WORKER_SETTINGS, enqueue, events, install_in, kinds, until_call_is_held,
    write_agents,
};
use crate::support::{Sandbox, runwarden};

/// Polls a run's events until one of `kind` is stored (the CLI in another process reads
/// the database, as an operator would).
async fn until_event(sandbox: &std::sync::Arc<Sandbox>, id: &str, kind: &str) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let events = events(sandbox, id).await;
        if let Some(event) = events.iter().find(|e| e["kind"] == kind) {
            return event.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {kind} in {:?}",
            kinds(&events)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_limit_and_a_killed_holders_slot_comes_back_after_its_lease() {
    // Agent nK calls `create({"q": "hold K"})`, which the server holds open.
    let agents = write_agents("n", "hold", 2);
    let cluster = TempCluster::start();
    let url = cluster.fresh_database().await;
    let sandbox = tokio::task::spawn_blocking(move || Sandbox::initialised_on(&url))
        .await
        .unwrap();
    let Install {
        sandbox,
        mut server,
        calls,
    } = install_in(sandbox, WORKER_SETTINGS, &agents).await;
    sandbox.append_config(
        "\n[limits]\nlease_seconds = 1\n\n[limits.servers.srv]\nconcurrency = 1\nmax_wait_seconds = 60\n",
    );
    let holder = Child::worker(&sandbox, Some(1));
    let first = enqueue(&sandbox, "n0", "hold").await;
    until_call_is_held(&mut server, "create", "hold 0").await;
    let waiter = Child::worker(&sandbox, Some(1));
    let second = enqueue(&sandbox, "n1", "hold").await;
    let wait = until_event(&sandbox, &second, "limit_wait").await;
    assert_eq!(
        wait["payload"]["limit"],
        "concurrency limit of server srv (1 at once)"
    );
    assert_eq!(
        calls.of("create", "hold 1"),
        0,
        "the other node's call waits unsent"
    );

    let killed = Instant::now();
    holder.signal("KILL");
    until_call_is_held(&mut server, "create", "hold 1").await;
    let took = killed.elapsed();
    // The lease is 1 s and a waiter looks every 250 ms; generous for a loaded machine.
    assert!(
        took < Duration::from_secs(5),
        "the slot came back after {took:?}"
    );
    let waited = until_event(&sandbox, &second, "limit_waited").await;
    assert_eq!(waited["payload"]["outcome"], "taken");
    assert_eq!(calls.of("create", "hold 0"), 1);
    let status = runwarden(&sandbox, &["--json", "status", &first])
        .await
        .ok()
        .json();
    assert_ne!(status["status"], "completed", "{status:#}");
    waiter.signal("KILL");
    drop(cluster);
}
