//! The queue as a client meets it: `POST /v1/runs` and `enqueue` safe to retry with an
//! idempotency key, a hint when no worker is there to claim a run (and `events --follow`
//! saying what it waits for), and a final event for a run cancelled while queued.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::support::serve::{Serve, named_token};
use crate::support::workers::{
    Install, WORKER_SETTINGS, call_then_answer, events, install_in, kinds, status,
};
use crate::support::{Live, Sandbox, runwarden};

/// A sandbox with the scripted agent `a` (it answers at once).
fn answering() -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.append_config("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(
        sandbox.path().join("plan.json"),
        json!([{"text": "done"}]).to_string(),
    )
    .unwrap();
    Arc::new(sandbox)
}

/// `POST /v1/runs` with an optional `Idempotency-Key`: the status and the body.
async fn post(serve: &Serve, token: &str, key: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/runs", serve.url()))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("the body reads");
    (status, serde_json::from_str(&text).expect("a JSON body"))
}

/// How many runs of agent `a` the API lists.
async fn runs_of_a(serve: &Serve, token: &str) -> usize {
    let text = reqwest::Client::new()
        .get(format!("{}/v1/runs?agent=a&limit=200", serve.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let list: Value = serde_json::from_str(&text).unwrap();
    list["runs"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_makes_one_run_per_body_and_refuses_another_body() {
    let sandbox = answering();
    let (ci, other) = (
        named_token(&sandbox, "operator", "ci").await,
        named_token(&sandbox, "operator", "other").await,
    );
    let serve = Serve::start(&sandbox, 0).await;
    let body = json!({"agent": "a", "prompt": "file a ticket"});

    let (code, first) = post(&serve, &ci, Some("key-1"), body.clone()).await;
    assert_eq!(code, 202, "{first}");
    let run_id = first["run_id"].as_str().unwrap().to_string();
    // The same request again, spelled differently (the default mode said out loud).
    let respelled = json!({"prompt": "file a ticket", "mode": "queued", "agent": "a"});
    let (code, again) = post(&serve, &ci, Some("key-1"), respelled).await;
    assert_eq!(
        (code, again["run_id"].as_str()),
        (200, Some(run_id.as_str())),
        "{again}"
    );

    let (code, refused) = post(
        &serve,
        &ci,
        Some("key-1"),
        json!({"agent": "a", "prompt": "something else"}),
    )
    .await;
    assert_eq!(code, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "idempotency_key_reused");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&run_id),
        "{refused}"
    );

    // Keys are per token: another caller's key-1 is its own.
    let (code, theirs) = post(&serve, &other, Some("key-1"), body.clone()).await;
    assert_eq!(code, 202);
    assert_ne!(theirs["run_id"], first["run_id"]);
    assert_eq!(
        runs_of_a(&serve, &ci).await,
        2,
        "no run from the retry or the refusal"
    );

    // Eight identical requests at once make one run.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let (url, token, body) = (serve.url(), ci.clone(), body.clone());
            tokio::spawn(async move {
                let response = reqwest::Client::new()
                    .post(format!("{url}/v1/runs"))
                    .bearer_auth(token)
                    .header("Idempotency-Key", "key-race")
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                let code = response.status().as_u16();
                let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
                (
                    code,
                    body["run_id"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    let mut created = 0;
    for racer in racers {
        let (code, id) = racer.await.unwrap();
        assert!(code == 200 || code == 202, "{code}");
        created += usize::from(code == 202);
        ids.insert(id);
    }
    assert_eq!((created, ids.len()), (1, 1), "{ids:?}");
    assert_eq!(runs_of_a(&serve, &ci).await, 3);

    let (code, bad) = post(&serve, &ci, Some("has a space"), body.clone()).await;
    assert_eq!(
        (code, bad["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let sync = json!({"agent": "a", "prompt": "now", "mode": "sync"});
    let (code, bad) = post(&serve, &ci, Some("key-sync"), sync).await;
    assert_eq!(code, 400, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queued runs")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_with_an_idempotency_key_is_safe_to_retry() {
    let sandbox = answering();
    let enqueue = |prompt: &'static str| {
        let sandbox = sandbox.clone();
        async move {
            runwarden(
                &sandbox,
                &[
                    "enqueue",
                    "--agent",
                    "a",
                    "--idempotency-key",
                    "nightly-42",
                    prompt,
                ],
            )
            .await
        }
    };
    let first = enqueue("file a ticket").await.ok();
    let again = enqueue("file a ticket").await.ok();
    assert_eq!(
        first.stdout.trim(),
        again.stdout.trim(),
        "the retry names the first run"
    );
    enqueue("another ticket")
        .await
        .fails()
        .says("already made run")
        .says(first.stdout.trim());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_and_events_follow_say_when_no_worker_is_there_to_claim_the_run() {
    let Install { sandbox, .. } = install_in(
        Sandbox::initialised(),
        WORKER_SETTINGS,
        &[("w".to_string(), call_then_answer("search", "x"))],
    )
    .await;
    let out = runwarden(&sandbox, &["enqueue", "--agent", "quick", "hello"])
        .await
        .ok();
    let run_id = out.stdout.trim().to_string();
    assert!(
        out.stderr
            .contains("no worker has been seen in the last 15 s")
            && out.stderr.contains("runwarden worker"),
        "{out:#?}"
    );

    let mut follow = Live::start(&sandbox, &["events", &run_id, "--follow"]);
    let said = follow.err_line().await;
    assert_eq!(
        said,
        format!("run {run_id} is queued: waiting for a worker to claim it")
    );
    assert!(follow.err_line().await.contains("no worker has been seen"));

    // A worker comes: the follower sees the run through, and the next enqueue is quiet.
    let mut worker = Live::worker(&sandbox, None);
    loop {
        if follow.line().await.contains("completed") {
            break;
        }
    }
    let out = runwarden(&sandbox, &["enqueue", "--agent", "quick", "again"])
        .await
        .ok();
    assert!(!out.stderr.contains("no worker"), "{out:#?}");
    worker.stop_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_while_queued_ends_with_a_final_event_that_says_so() {
    let sandbox = answering();
    let run_id = runwarden(&sandbox, &["enqueue", "--agent", "a", "hello"])
        .await
        .ok()
        .stdout
        .trim()
        .to_string();
    runwarden(&sandbox, &["cancel", &run_id]).await.ok();

    let log = events(&sandbox, &run_id).await;
    assert_eq!(kinds(&log), ["run_stopped"], "R8: the final event, once");
    assert_eq!(log[0]["payload"]["outcome"], "cancelled");
    let text = runwarden(&sandbox, &["events", &run_id]).await.ok();
    assert!(
        text.stdout
            .contains("stopped: cancelled: cancelled by an operator while queued"),
        "{text:#?}"
    );
    // A follower does not wait for anything more.
    let follow = runwarden(&sandbox, &["events", &run_id, "--follow"])
        .await
        .ok();
    assert!(follow.stdout.contains("stopped: cancelled"), "{follow:#?}");
    assert_eq!(status(&sandbox, &run_id).await["status"], "cancelled");
}
