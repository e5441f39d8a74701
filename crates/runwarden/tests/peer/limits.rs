//! R14 as operators meet it: `[limits]` in the file, runs executed by two `runwarden
//! worker` processes over one SQLite file, and the real Python MCP peer
//! (`tests/peer/server.py`), whose own counters say how many calls it held at once
//! (`occupy`) and how many it answered (`echo`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::Live as Child;
use crate::support::workers::{config_with_short_leases, enqueue, events, kinds};
use crate::support::{Sandbox, runwarden};

/// An initialised sandbox with the peer imported as `peer`, agent `helper` playing
/// `plan` with the peer's `tools`, and `limits` appended.
async fn install(peer: &Peer, plan: Value, tools: &str, limits: &str) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = config_with_short_leases(&sandbox);
    text.push_str(&format!(
        "\n[mcp.servers.peer]\nurl = \"{}\"\neffect = \"read_only\"\n\n[agents.helper]\nprovider = \"scripted\"\nscript = \"helper.json\"\ntools = [{tools}]\n\n{limits}\n",
        peer.url()
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("helper.json"), plan.to_string()).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    sandbox
}

/// Reads outcome lines from both workers until `n` runs ended; their outcomes.
async fn outcomes(workers: &mut [Child; 2], n: usize, within: Duration) -> Vec<Value> {
    let [a, b] = workers;
    let mut ended = Vec::new();
    tokio::time::timeout(within, async {
        while ended.len() < n {
            let line = tokio::select! {
                line = a.json() => line,
                line = b.json() => line,
            };
            if line.get("run_id").is_some() {
                ended.push(line);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {n} runs ended in {within:?}", ended.len()));
    ended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_runs_on_two_worker_processes_never_put_more_than_k_calls_on_the_peer() {
    let peer = Peer::start(&[]);
    let plan = json!([
        {"tool_calls": [{"name": "peer__occupy", "arguments": {"seconds": 0.3}}]},
        {"text": "done"}
    ]);
    let limits = "[limits.servers.peer]\nconcurrency = 2\nmax_wait_seconds = 120\n";
    let sandbox = install(&peer, plan, "\"peer__occupy\"", limits).await;
    let runs = 8;
    let mut ids = Vec::new();
    for _ in 0..runs {
        ids.push(enqueue(&sandbox, "helper", "hold a call").await);
    }
    let mut workers = [
        Child::worker(&sandbox, Some(4)),
        Child::worker(&sandbox, Some(4)),
    ];
    let ended = outcomes(&mut workers, runs, Duration::from_secs(60)).await;
    assert!(
        ended.iter().all(|o| o["outcome"] == "completed"),
        "{ended:#?}"
    );
    let stats = peer.stats_json();
    assert_eq!(stats["calls"]["occupy"], runs, "{stats}");
    assert_eq!(
        stats["occupy_most_in_flight"], 2,
        "K calls at once on the wire, never more: {stats}"
    );
    let mut waited = 0;
    for id in &ids {
        let events = events(&sandbox, id).await;
        if kinds(&events).contains(&"limit_wait") {
            waited += 1;
            let wait = events.iter().find(|e| e["kind"] == "limit_waited").unwrap();
            assert_eq!(wait["payload"]["outcome"], "taken", "{wait:#}");
        }
    }
    assert!(waited >= runs - 4, "only {waited} runs waited");
    for worker in &mut workers {
        worker.stop_idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_on_two_worker_processes_holds_over_a_minute_within_five_percent() {
    let peer = Peer::start(&[]);
    let call = json!({"name": "peer__echo", "arguments": {"text": "tick"}});
    let plan = json!([{"tool_calls": vec![call; 10]}, {"text": "done"}]);
    let rate = 5.0;
    let limits = format!(
        "[limits.tools.\"peer__echo\"]\nrate_per_second = {rate}\nburst = 1\nmax_wait_seconds = 120\n"
    );
    let sandbox = install(&peer, plan, "\"peer__echo\"", &limits).await;
    // More calls than a minute at the rate allows, so the limit is the only bound.
    for _ in 0..40 {
        enqueue(&sandbox, "helper", "echo ten times").await;
    }
    let mut workers = [
        Child::worker(&sandbox, Some(4)),
        Child::worker(&sandbox, Some(4)),
    ];
    let echoes = |stats: &Value| stats["calls"]["echo"].as_u64().unwrap_or(0);
    // Past the start, so every worker slot is busy calling.
    peer.wait_for_stats(Duration::from_secs(30), |s| echoes(s) >= 10)
        .await;
    let (first, started) = (echoes(&peer.stats_json()), Instant::now());
    // The measurement's window, not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (last, window) = (echoes(&peer.stats_json()), started.elapsed());
    let expected = rate * window.as_secs_f64();
    let got = (last - first) as f64;
    println!(
        "{got} calls in {window:?}: {:.2} per second",
        got / window.as_secs_f64()
    );
    assert!(
        (got - expected).abs() <= expected * 0.05,
        "{got} calls in {window:?}, expected {expected:.0} within 5 %"
    );
    for worker in &mut workers {
        worker.signal("KILL");
    }
}
