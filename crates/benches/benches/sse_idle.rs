//! Measures what idle live event streams cost a real `runwarden serve` (O6): the server
//! process's CPU over a window while N `GET /v1/runs/{id}/events` Server-Sent Event
//! streams of a run that does nothing are open, and the latency of `GET /v1/runs/{id}`
//! answered meanwhile. The run stays queued (`serve --concurrency 0`), so nothing changes
//! and every cycle the server spends is the streams' idle cost.
//!
//! Run: `cargo bench -p runwarden-benches --bench sse_idle` (add `-- --json` for JSON lines,
//! `-- --streams 3000` for another count).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use runwarden_testkit::Dist;
use serde_json::{Value, json};

use common::runwarden;

const WINDOW: Duration = Duration::from_secs(5);
const GETS: usize = 200;

/// User plus system CPU time of a process so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the server runs");
    // The command name may hold spaces; the fields after it are fixed.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

struct Figures {
    streams: usize,
    cores: f64,
    get: Dist,
    /// How much the server's resident set grew per stream once they were open (KiB).
    rss_per_stream_kib: f64,
}

async fn measure(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    run_id: &str,
    pid: u32,
    streams: usize,
) -> Figures {
    let mut open = Vec::with_capacity(streams);
    let rss0 = runwarden_benches::rss_kib(Some(pid));
    for _ in 0..streams {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let answer = client
            .get(format!("{url}/v1/runs/{run_id}/events"))
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{}", answer.status());
        open.push((client, answer));
    }
    // Let the streams settle into their idle state before the window opens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = runwarden_benches::rss_kib(Some(pid)).saturating_sub(rss0);
    let rss_per_stream_kib = grown as f64 / streams.max(1) as f64;
    let (cpu_before, started) = (cpu_time(pid), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let cores = (cpu_time(pid) - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
    let mut samples = Vec::with_capacity(GETS);
    for _ in 0..GETS {
        let sent = Instant::now();
        let answer = http
            .get(format!("{url}/v1/runs/{run_id}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success());
        answer.bytes().await.unwrap();
        samples.push(sent.elapsed());
    }
    drop(open);
    Figures {
        streams,
        cores,
        get: Dist::new(samples),
        rss_per_stream_kib,
    }
}

fn main() {
    let json_output = std::env::args().any(|a| a == "--json");
    let streams: usize = std::env::args()
        .skip_while(|a| a != "--streams")
        .nth(1)
        .map_or(1000, |n| n.parse().expect("--streams takes a number"));
    let dir = tempfile::tempdir().unwrap();
    runwarden(dir.path(), &["init"]);
    let config = dir.path().join("runwarden.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    // Every stream comes from 127.0.0.1: the per-client cap must admit them all.
    let cap = streams + 100;
    text.push_str(&format!(
        "\n[serve]\nmax_connections = {cap}\nmax_connections_per_client = {cap}\n"
    ));
    runwarden_benches::raise_nofile();
    std::fs::write(&config, text).unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    let token = common::token(dir.path(), "viewer");
    let enqueued: Value = serde_json::from_slice(
        &runwarden(dir.path(), &["--json", "enqueue", "--agent", "a", "idle"]).stdout,
    )
    .unwrap();
    let run_id = enqueued["run_id"].as_str().unwrap().to_string();

    // No worker slots: the run stays queued and its streams stay idle.
    let (serve, url) = common::serve(
        common::command(&config, &[]),
        &["--listen", "127.0.0.1:0", "--concurrency", "0"],
        Stdio::null(),
    );
    let pid = serve.0.id();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let rows: Vec<Figures> = [0, streams]
        .into_iter()
        .map(|n| runtime.block_on(measure(&http, &url, &token, &run_id, pid, n)))
        .collect();
    if !json_output {
        println!(
            "idle live event streams against runwarden serve on 127.0.0.1 (CPU over {:.0} s, then {GETS} GET /v1/runs/{{id}})",
            WINDOW.as_secs_f64()
        );
        println!(
            "| open SSE streams | server CPU (cores) | GET p50 | GET p99 | server RSS per stream |"
        );
        println!("| --- | --- | --- | --- | --- |");
    }
    for row in &rows {
        let (p50, p99) = (row.get.pct(50.0), row.get.pct(99.0));
        if json_output {
            println!(
                "{}",
                json!({"figure": "idle sse streams", "streams": row.streams, "server_cores": row.cores,
                       "get_p50_ms": p50.as_secs_f64() * 1e3, "get_p99_ms": p99.as_secs_f64() * 1e3,
                       "server_rss_kib_per_stream": row.rss_per_stream_kib})
            );
        } else {
            println!(
                "| {} | {:.3} | {:.2} ms | {:.2} ms | {:.1} KiB |",
                row.streams,
                row.cores,
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3,
                row.rss_per_stream_kib
            );
        }
    }
}
