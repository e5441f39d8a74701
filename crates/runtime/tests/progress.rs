//! L6: while a model streams, throttled `model_progress` events (tokens so far) reach the
//! run's log and its live observer, never one per token, and never after the step that
//! ends the call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runwarden_models::{ModelError, ModelProvider, ModelRequest, ModelTurn};
use runwarden_runtime::store::RunEvent;
use runwarden_runtime::{Executor, ExecutorConfig, Outcome, RunStore};
use runwarden_vault::CancellationSignal;

use crate::support::fixture;

/// A model that streams `tokens` deltas at a generation pace of one per `gap`, reporting
/// each to the request's progress, then answers.
struct Paced {
    tokens: u64,
    gap: Duration,
}

#[async_trait]
impl ModelProvider for Paced {
    async fn complete(
        &self,
        request: &ModelRequest,
        _: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        for n in 1..=self.tokens {
            // The model's pace, not a wait for a condition: tokens take time to generate.
            tokio::time::sleep(self.gap).await;
            if let Some(progress) = &request.progress {
                progress.report(n);
            }
        }
        Ok(ModelTurn::new(Some("done".into()), vec![]))
    }
}

fn executor_with_interval(f: &crate::support::Fixture, interval: Duration) -> Executor {
    Executor::new(
        f.store.clone(),
        f.watcher.clone(),
        ExecutorConfig {
            progress_interval: interval,
            ..ExecutorConfig::new("test")
        },
    )
}

#[tokio::test]
async fn a_streaming_model_reports_tokens_so_far_at_most_once_per_interval() {
    let f = fixture().await;
    let interval = Duration::from_millis(50);
    let executor = executor_with_interval(&f, interval);
    let agent = f.agent_with(
        Arc::new(Paced {
            tokens: 40,
            gap: Duration::from_millis(10),
        }),
        vec![],
    );
    let run = executor.create_sync("helper", "go").await.unwrap();
    let seen: Arc<Mutex<Vec<RunEvent>>> = Arc::default();
    let observed = seen.clone();
    let observer: runwarden_runtime::Observer =
        Arc::new(move |event: &RunEvent| observed.lock().unwrap().push(event.clone()));
    assert_eq!(
        executor.execute(&run, &agent, "go", Some(observer)).await,
        Outcome::Completed
    );

    let events = f.store.run_events(&run.id, 0, 1000).await.unwrap();
    let progress: Vec<&RunEvent> = events
        .iter()
        .filter(|e| e.kind == "model_progress")
        .collect();
    // 40 tokens over at least 400 ms with one event per 50 ms at most: some, never one per token.
    assert!(!progress.is_empty(), "a 400 ms stream reports progress");
    assert!(
        progress.len() <= 10,
        "throttled: {} events for 40 tokens",
        progress.len()
    );
    let tokens: Vec<u64> = progress
        .iter()
        .map(|e| e.payload["tokens"].as_u64().unwrap())
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens so far only grow: {tokens:?}"
    );
    assert!(tokens.iter().all(|&t| t <= 40));
    assert!(progress.iter().all(|e| e.payload["round"] == 1));
    for pair in progress.windows(2) {
        assert!(
            pair[1].time_ms - pair[0].time_ms >= 49,
            "two events of one call are an interval apart: {} ms",
            pair[1].time_ms - pair[0].time_ms
        );
    }
    let response = events
        .iter()
        .position(|e| e.kind == "model_response")
        .expect("the step is recorded");
    let last_progress = events
        .iter()
        .rposition(|e| e.kind == "model_progress")
        .unwrap();
    assert!(
        last_progress < response,
        "no progress event follows the step that ends the call"
    );
    let observed: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.clone())
        .collect();
    assert_eq!(
        observed.iter().filter(|k| *k == "model_progress").count(),
        progress.len(),
        "the live observer sees each progress event as it is stored"
    );
    // The final answer and the run's end are stored by one write; the observer is told
    // of both, each with its own sequence number, as of every other stored event.
    let stored: Vec<(i64, &str)> = events.iter().map(|e| (e.seq, e.kind.as_str())).collect();
    let mut told: Vec<(i64, String)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.seq, e.kind.clone()))
        .collect();
    told.sort();
    let told: Vec<(i64, &str)> = told.iter().map(|(s, k)| (*s, k.as_str())).collect();
    assert_eq!(told, stored);
    assert_eq!(
        stored[stored.len() - 2..]
            .iter()
            .map(|e| e.1)
            .collect::<Vec<_>>(),
        ["model_response", "run_completed"]
    );
}

#[tokio::test]
async fn a_call_shorter_than_the_interval_writes_no_progress_event() {
    let f = fixture().await;
    let agent = f.agent_with(
        Arc::new(Paced {
            tokens: 30,
            gap: Duration::ZERO,
        }),
        vec![],
    );
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    assert_eq!(
        f.executor.execute(&run, &agent, "go", None).await,
        Outcome::Completed
    );
    let kinds: Vec<String> = f
        .store
        .run_events(&run.id, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["run_started", "model_response", "run_completed"]);
}
