//! M19 + R12 end to end: a 2026-07-28 server (the real Python SDK) answers a tool call
//! with `input_required`; the run parks on an `input` decision that keeps the server's
//! `requestState`, the worker that asked goes away, an operator answers from another
//! process, and a new worker process re-issues the call with the answer and the state.
//! The SDK seals and verifies its state, so the call succeeding proves it came back exact.

use std::sync::Arc;

use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::Live as Child;
use crate::support::workers::{config_with_short_leases, enqueue, events, status};
use crate::support::{Sandbox, runwarden};

/// How often the peer ran `confirm_ship`'s body, by its own count.
fn shipments(peer: &Peer) -> u64 {
    let stats: Value =
        serde_json::from_str(&peer.get("/modern-stats")).expect("modern stats are JSON");
    stats["confirm_ship_runs"].as_u64().unwrap_or(u64::MAX)
}

async fn install(peer: &Peer) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = config_with_short_leases(&sandbox);
    text.push_str(&format!(
        "\n[mcp.servers.peer]\nurl = \"{}\"\nelicitation = \"operator\"\n\n[agents.shipper]\nprovider = \"scripted\"\nscript = \"shipper.json\"\ntools = [\"peer__confirm_ship\"]\n",
        peer.url()
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let plan = json!([
        {"tool_calls": [{"name": "peer__confirm_ship", "arguments": {"item": "box"}}]},
        {"text": "done"}
    ]);
    std::fs::write(sandbox.path().join("shipper.json"), plan.to_string()).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    sandbox
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_required_result_parks_the_run_and_another_worker_resumes_it_with_the_state() {
    let peer = tokio::task::spawn_blocking(|| Peer::start(&[]))
        .await
        .unwrap();
    let sandbox = install(&peer).await;

    let mut first = Child::worker(&sandbox, None);
    let run_id = enqueue(&sandbox, "shipper", "ship the box").await;
    let (outcome, _) = first.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "waiting_for_approval", "{outcome:#}");
    assert_eq!(shipments(&peer), 0, "nothing of the tool ran yet");
    let row = status(&sandbox, &run_id).await;
    assert_eq!(row["status"], "waiting_for_approval", "{row:#}");
    assert_eq!(
        row["lease_expires"],
        Value::Null,
        "a parked run holds no lease"
    );
    let listed = runwarden(
        &sandbox,
        &[
            "--json",
            "decisions",
            "list",
            "--run",
            &run_id,
            "--status",
            "pending",
        ],
    )
    .await
    .ok();
    let decisions = listed.json()["decisions"].as_array().unwrap().clone();
    assert_eq!(decisions.len(), 1, "{decisions:#?}");
    let decision = &decisions[0];
    assert_eq!(decision["kind"], "input", "{decision:#}");
    assert!(
        decision["message"]
            .as_str()
            .unwrap_or("")
            .contains("Ship box?"),
        "{decision:#}"
    );
    // The server's state is kept for the re-issue, never shown.
    assert!(!listed.stdout.contains("v1."), "{}", listed.stdout);
    // The worker that asked is gone before anyone answers.
    first.stop_idle().await;

    let id = decision["decision_id"].as_str().unwrap();
    runwarden(
        &sandbox,
        &["answer", id, "--content", r#"{"confirmed": true}"#],
    )
    .await
    .ok();
    let mut second = Child::worker(&sandbox, None);
    let (outcome, _) = second.outcome_of(&run_id).await;
    assert_eq!(outcome["outcome"], "completed", "{outcome:#}");
    assert_eq!(shipments(&peer), 1, "the re-issued call ran the tool once");
    let texts: Vec<String> = events(&sandbox, &run_id)
        .await
        .iter()
        .filter(|e| e["kind"] == "tool_executed")
        .map(|e| {
            e["payload"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(texts, ["shipped box: confirmed=True"]);
    second.stop_idle().await;
}
