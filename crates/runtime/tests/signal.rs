//! R6: the in-flight signal's properties, each on its own, with a counting store and a
//! manual clock.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runwarden_mcp::ManualClock;
use runwarden_runtime::{RunSignal, RunStore};
use runwarden_vault::CancellationSignal;

use crate::support::{Fixture, fixture_with_clock};

async fn setup() -> (Fixture, Arc<ManualClock>, RunSignal, String) {
    let clock = Arc::new(ManualClock::default());
    let f = fixture_with_clock(clock.clone()).await;
    let run = f.executor.create_sync("helper", "go").await.unwrap();
    let signal = RunSignal::new(&run.id, f.store.clone(), clock.clone(), &f.hub);
    (f, clock, signal, run.id)
}

fn reads(f: &Fixture) -> usize {
    f.store.probe_reads.load(Ordering::SeqCst)
}

#[tokio::test]
async fn the_first_call_always_reads_the_row() {
    let (f, _clock, signal, run_id) = setup().await;
    f.store.inner.run_cancel(&run_id, 0).await.unwrap();
    assert!(
        signal.is_cancelled(),
        "a run cancelled before the call is seen on the first question"
    );
    assert_eq!(reads(&f), 1);
}

#[tokio::test]
async fn the_row_is_read_at_most_once_per_second() {
    let (f, clock, signal, _run_id) = setup().await;
    for _ in 0..10 {
        assert!(!signal.is_cancelled());
    }
    assert_eq!(reads(&f), 1);
    clock.advance(Duration::from_millis(999));
    assert!(!signal.is_cancelled());
    assert_eq!(reads(&f), 1);
    clock.advance(Duration::from_millis(1));
    assert!(!signal.is_cancelled());
    assert_eq!(reads(&f), 2);
}

#[tokio::test]
async fn a_store_error_reads_as_not_cancelled() {
    let (f, _clock, signal, run_id) = setup().await;
    f.store.inner.run_cancel(&run_id, 0).await.unwrap();
    f.store.fail_probes.store(true, Ordering::SeqCst);
    assert!(
        !signal.is_cancelled(),
        "a store hiccup never fabricates a cancellation"
    );
    assert_eq!(reads(&f), 1);
}

#[tokio::test]
async fn once_true_it_never_reads_again() {
    let (f, clock, signal, run_id) = setup().await;
    f.store.inner.run_cancel(&run_id, 0).await.unwrap();
    assert!(signal.is_cancelled());
    // Even if the row were changed back by hand, a torn-down transfer stays torn down.
    rusqlite::Connection::open(f.dir.path().join("runwarden.db"))
        .unwrap()
        .execute(
            "UPDATE runs SET status = 'running' WHERE id = ?1",
            [&run_id],
        )
        .unwrap();
    for _ in 0..5 {
        clock.advance(Duration::from_secs(2));
        assert!(signal.is_cancelled());
    }
    assert_eq!(reads(&f), 1);
}

#[tokio::test]
async fn a_cancel_through_this_process_makes_the_next_question_read_at_once() {
    let (f, _clock, signal, run_id) = setup().await;
    assert!(!signal.is_cancelled());
    let woken = signal.woken();
    f.executor.cancel(&run_id).await.unwrap();
    tokio::time::timeout(crate::support::WAIT, woken)
        .await
        .expect("the cancel wakes the signal");
    assert!(
        signal.is_cancelled(),
        "read despite the one-second throttle"
    );
    assert_eq!(reads(&f), 2);
}

#[tokio::test]
async fn a_wake_missed_by_the_future_still_makes_the_next_question_read() {
    let (f, _clock, signal, run_id) = setup().await;
    assert!(!signal.is_cancelled());
    // No `woken()` future exists at the instant of the cancel.
    f.executor.cancel(&run_id).await.unwrap();
    assert!(signal.is_cancelled());
    assert_eq!(reads(&f), 2);
}
