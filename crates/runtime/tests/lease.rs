//! A segment whose lease cannot be renewed fences itself: with every renewal hanging in
//! the store, its call in flight is stopped and the segment ends `lease_lost` before the
//! lease runs out, so no other worker can hold the run while this one still calls.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runwarden_models::OpenAiCompatible;
use runwarden_runtime::{Executor, ExecutorConfig, Outcome, RunState, RunStore};
use runwarden_testkit::{HttpReply, TestServer};

use crate::support::{WAIT, fixture};

use runwarden_base::now_ms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_that_cannot_renew_its_lease_stops_its_call_before_the_lease_runs_out() {
    let f = fixture().await;
    let config = ExecutorConfig {
        lease: Duration::from_secs(3),
        heartbeat: Duration::from_millis(300),
        ..ExecutorConfig::new("fenced")
    };
    let executor = Arc::new(Executor::new(f.store.clone(), f.watcher.clone(), config));
    let mut model = TestServer::start(|_| HttpReply::Stall).await;
    let provider = Arc::new(OpenAiCompatible::new(
        f.egress.clone(),
        model.url("/v1"),
        "slow-model",
    ));
    let agent = f.agent_with(provider, vec![]);
    let run = executor.create_sync("helper", "go").await.unwrap();
    let expires = run.lease_expires_ms.expect("a fresh run has a lease");
    f.store.hang_heartbeats.store(true, Ordering::SeqCst);
    let (task_executor, task_run) = (executor.clone(), run.clone());
    let task =
        tokio::spawn(async move { task_executor.execute(&task_run, &agent, "go", None).await });
    model.next_request(WAIT).await;
    model.next_close(WAIT).await;
    let closed = now_ms();
    assert!(
        closed < expires,
        "the call stopped {} ms before the lease ran out, not after",
        expires - closed
    );
    assert_eq!(
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap(),
        Outcome::LeaseLost
    );
    // The fenced segment settled nothing: the run stays running until its lease runs
    // out and the reaper decides.
    let row = f.store.inner.run_get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, RunState::Running, "{row:?}");
}
