//! O5: `/metrics` counts what each process did. Two `serve` processes on one database report
//! their own request counters, and the same database figures; a scraper with no token reads
//! them where `[metrics]` allows it.

use serde_json::json;

use crate::support::serve::install;
use crate::support::serve_api;

async fn scrape(url: &str) -> String {
    let answer = reqwest::get(url).await.unwrap();
    assert_eq!(answer.status(), 200, "{url}");
    answer.text().await.unwrap()
}

fn counter(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_database_report_their_own_request_counters() {
    let mcp = runwarden_testkit::TestServer::start(runwarden_testkit::mcp_handler(
        vec![runwarden_testkit::tool("create")],
        &[],
    ))
    .await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    sandbox.append_config("[metrics]\nrequire_token = false\nlisten = \"127.0.0.1:0\"\n");
    let (first, first_ready) = serve_api(&sandbox).await;
    let (second, second_ready) = serve_api(&sandbox).await;
    let first_api = first_ready["url"].as_str().unwrap().to_string();
    let second_api = second_ready["url"].as_str().unwrap().to_string();
    let second_metrics = second_ready["metrics"].as_str().unwrap().to_string();
    assert!(second_metrics.ends_with("/metrics"), "{second_ready}");

    for _ in 0..3 {
        assert_eq!(
            reqwest::get(format!("{first_api}/healthz"))
                .await
                .unwrap()
                .status(),
            200
        );
    }
    assert_eq!(
        reqwest::get(format!("{second_api}/healthz"))
            .await
            .unwrap()
            .status(),
        200
    );

    // No token: `require_token = false` opens the API port's /metrics, and the listener of
    // its own never asks for one.
    let first_text = scrape(&format!("{first_api}/metrics")).await;
    let second_text = scrape(&second_metrics).await;
    let healthz = "runwarden_http_requests_total{route=\"/healthz\",method=\"GET\",status=\"200\"}";
    assert_eq!(counter(&first_text, healthz), 3, "{first_text}");
    assert_eq!(counter(&second_text, healthz), 1, "{second_text}");
    // The database's figures are the same wherever they are read.
    let queued = "runwarden_db_runs{status=\"queued\"}";
    assert_eq!(
        first_text.lines().find(|l| l.starts_with(queued)),
        second_text.lines().find(|l| l.starts_with(queued))
    );
    // The process's own parts: a status watcher, and no worker slots (concurrency 0).
    assert!(
        first_text
            .lines()
            .any(|l| l.starts_with("runwarden_status_watcher_queries_total ")),
        "{first_text}"
    );
    assert!(
        first_text
            .lines()
            .any(|l| l == "runwarden_worker_slots_busy 0"),
        "{first_text}"
    );
    // The metrics listener serves nothing else.
    let other = second_metrics.replace("/metrics", "/v1/runs");
    assert_eq!(reqwest::get(other).await.unwrap().status(), 404);
    first.signal("TERM");
    second.signal("TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_are_counted_by_kind_and_decisions_pending_are_reported() {
    let mcp = runwarden_testkit::TestServer::start(runwarden_testkit::mcp_handler(
        vec![runwarden_testkit::tool("create")],
        &[],
    ))
    .await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    sandbox.append_config("[metrics]\nrequire_token = false\n");
    let (server, ready) = serve_api(&sandbox).await;
    let api = ready["url"].as_str().unwrap().to_string();
    let busy = "runwarden_store_errors_total{kind=\"busy\"}";
    let before = scrape(&format!("{api}/metrics")).await;
    assert_eq!(counter(&before, busy), 0, "{before}");
    assert!(
        before
            .lines()
            .any(|l| l == "runwarden_db_decisions_pending 0"),
        "{before}"
    );

    // Another process holds the write lock: the readiness probe's write fails as `busy`.
    let holder = rusqlite::Connection::open(sandbox.database()).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let answer = reqwest::get(format!("{api}/readyz")).await.unwrap();
    assert_eq!(answer.status(), 503);
    holder.execute_batch("ROLLBACK").unwrap();

    let after = scrape(&format!("{api}/metrics")).await;
    assert!(counter(&after, busy) >= 1, "{after}");
    assert_eq!(
        counter(&after, "runwarden_store_errors_total{kind=\"corrupt\"}"),
        0,
        "{after}"
    );
    server.signal("TERM");
}
