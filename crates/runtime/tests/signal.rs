//! R6 (amended): the status watcher and its signals, one property per test, with a store
//! that counts (and fails, or holds) its batched status queries. The clock is tokio's paused
//! clock, so "per interval" is exact and a wake-up is told apart from the periodic refresh
//! by the virtual time that passed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runwarden_runtime::{
    CancelHub, Change, RunSignal, RunState, RunStore, StatusWatcher, WatcherConfig,
};
use runwarden_vault::CancellationSignal;
use tokio::time::Instant;

use crate::support::{Fixture, WAIT, fixture};

const INTERVAL: Duration = runwarden_runtime::DEFAULT_WATCH_INTERVAL;

async fn run(f: &Fixture) -> String {
    f.executor.create_sync("helper", "go").await.unwrap().id
}

/// Cancels the row as another process or node does: nothing on this process's feed or hub.
async fn cancel_elsewhere(f: &Fixture, run_id: &str) {
    f.other_process().run_cancel(run_id, 0).await.unwrap();
}

/// Signals for `runs`, all asked for at once.
async fn signals(watcher: &StatusWatcher, runs: &[String]) -> Vec<RunSignal> {
    let mut tasks = tokio::task::JoinSet::new();
    for id in runs {
        let (watcher, id) = (watcher.clone(), id.clone());
        tasks.spawn(async move { watcher.signal(&id).await });
    }
    let mut signals = Vec::new();
    while let Some(signal) = tasks.join_next().await {
        signals.push(signal.unwrap());
    }
    signals
}

#[tokio::test(start_paused = true)]
async fn n_calls_in_flight_cost_one_batched_query_per_interval_whatever_n() {
    let f = fixture().await;
    let mut per_window = Vec::new();
    for n in [1usize, 100, 1000] {
        let mut runs = Vec::with_capacity(n);
        for _ in 0..n {
            runs.push(run(&f).await);
        }
        let watcher = StatusWatcher::new(
            f.store.clone(),
            Arc::new(CancelHub::new()),
            WatcherConfig { interval: INTERVAL },
        );
        let before = f.status_reads();
        let signals = signals(&watcher, &runs).await;
        assert_eq!(
            f.status_reads() - before,
            1,
            "n = {n}: the first questions of calls asking at once share one query"
        );
        assert!(f.store.largest_read.load(Ordering::SeqCst) >= n);
        let registered = f.status_reads();
        tokio::time::sleep(INTERVAL * 5 + INTERVAL / 2).await;
        per_window.push(f.status_reads() - registered);
        assert_eq!(watcher.watched(), n);
        for signal in &signals {
            assert!(!signal.is_cancelled());
        }
        // The fixture's own watcher and this one: only this one has runs to read.
        drop(signals);
        drop(watcher);
    }
    assert_eq!(
        per_window,
        [5, 5, 5],
        "R6: reads per interval do not grow with the number of calls"
    );
}

#[tokio::test(start_paused = true)]
async fn is_cancelled_answers_from_memory_and_never_reads_the_store() {
    let f = fixture().await;
    let id = run(&f).await;
    let signal = f.watcher.signal(&id).await;
    let after_first = f.status_reads();
    for _ in 0..10_000 {
        assert!(!signal.is_cancelled());
    }
    assert_eq!(f.status_reads(), after_first);
}

#[tokio::test(start_paused = true)]
async fn the_first_question_is_answered_by_a_read_that_started_after_the_call_asked() {
    let f = fixture().await;
    let id = run(&f).await;
    // A signal that is alive the whole time: a second call of the run must still read.
    let first = f.watcher.signal(&id).await;
    assert!(!first.is_cancelled());
    cancel_elsewhere(&f, &id).await;
    let reads = f.status_reads();
    let second = f.watcher.signal(&id).await;
    assert!(
        second.is_cancelled(),
        "a run cancelled before the call asked is seen on its first question"
    );
    assert_eq!(f.status_reads(), reads + 1, "one fresh read");
    assert!(first.is_cancelled(), "the run's other calls learn it too");
}

#[tokio::test(start_paused = true)]
async fn a_call_that_asks_during_a_query_waits_for_the_next_one() {
    let f = fixture().await;
    let id = run(&f).await;
    let hold = f.store.hold_answers.lock().await;
    let watcher = f.watcher.clone();
    let (w, i) = (watcher.clone(), id.clone());
    let early = tokio::spawn(async move { w.signal(&i).await });
    // The early call's query has read "running" and is held before it answers.
    tokio::time::timeout(WAIT, f.store.read_done.notified())
        .await
        .expect("the early call's read");
    cancel_elsewhere(&f, &id).await;
    let (w, i) = (watcher.clone(), id.clone());
    let late = tokio::spawn(async move { w.signal(&i).await });
    tokio::task::yield_now().await;
    drop(hold);
    let early = early.await.unwrap();
    let late = late.await.unwrap();
    assert!(
        late.is_cancelled(),
        "the late call was not answered by the query that started before it asked"
    );
    assert!(
        early.is_cancelled(),
        "monotonic and shared by the run's calls"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_error_reads_as_not_cancelled_and_the_next_interval_reads_again() {
    let f = fixture().await;
    let id = run(&f).await;
    cancel_elsewhere(&f, &id).await;
    f.store.fail_probes.store(true, Ordering::SeqCst);
    let reads = f.status_reads();
    let signal = f.watcher.signal(&id).await;
    assert!(
        !signal.is_cancelled(),
        "a store hiccup never fabricates a cancellation"
    );
    assert_eq!(f.status_reads(), reads + 1, "the first question did read");
    f.store.fail_probes.store(false, Ordering::SeqCst);
    let woken = signal.woken();
    tokio::time::timeout(INTERVAL * 2, woken)
        .await
        .expect("the next periodic read wakes the call");
    assert!(signal.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn once_true_it_stays_true_and_the_run_is_never_read_again() {
    let f = fixture().await;
    let id = run(&f).await;
    cancel_elsewhere(&f, &id).await;
    let signal = f.watcher.signal(&id).await;
    assert!(signal.is_cancelled());
    let reads = f.status_reads();
    // Even if the row were changed back by hand, a torn-down transfer stays torn down.
    rusqlite::Connection::open(f.dir.path().join("runwarden.db"))
        .unwrap()
        .execute("UPDATE runs SET status = 'running' WHERE id = ?1", [&id])
        .unwrap();
    f.hub.wake(&id);
    f.store.inner.change_feed().publish(Change::Status {
        run_id: id.clone(),
        status: RunState::Cancelled,
    });
    f.store.inner.change_feed().publish(Change::Resync);
    tokio::time::sleep(INTERVAL * 5).await;
    assert!(signal.is_cancelled());
    assert_eq!(f.status_reads(), reads, "the run left the batch");
}

#[tokio::test(start_paused = true)]
async fn a_cancel_through_this_process_wakes_the_call_at_once() {
    let f = fixture().await;
    let id = run(&f).await;
    let signal = f.watcher.signal(&id).await;
    assert!(!signal.is_cancelled());
    let woken = signal.woken();
    let issued = Instant::now();
    f.executor.cancel(&id).await.unwrap();
    tokio::time::timeout(WAIT, woken)
        .await
        .expect("the cancel wakes the call");
    assert!(signal.is_cancelled());
    assert!(
        issued.elapsed() < INTERVAL,
        "woken, not found by the periodic refresh: {:?}",
        issued.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn the_cancel_hub_alone_makes_the_watcher_read_at_once() {
    let f = fixture().await;
    let id = run(&f).await;
    let signal = f.watcher.signal(&id).await;
    cancel_elsewhere(&f, &id).await;
    let woken = signal.woken();
    let issued = Instant::now();
    f.hub.wake(&id);
    tokio::time::timeout(WAIT, woken).await.expect("woken");
    assert!(
        signal.is_cancelled(),
        "the row, read at once, says cancelled"
    );
    assert!(issued.elapsed() < INTERVAL, "{:?}", issued.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_announced_on_the_change_feed_wakes_a_call_whose_process_never_cancelled() {
    let f = fixture().await;
    let id = run(&f).await;
    let signal = f.watcher.signal(&id).await;
    // Another node cancels the row; its NOTIFY reaches this process as a change.
    cancel_elsewhere(&f, &id).await;
    let woken = signal.woken();
    let issued = Instant::now();
    f.store.inner.change_feed().publish(Change::Status {
        run_id: id.clone(),
        status: RunState::Cancelled,
    });
    tokio::time::timeout(WAIT, woken).await.expect("woken");
    assert!(signal.is_cancelled());
    assert!(
        issued.elapsed() < INTERVAL,
        "woken by the feed, not by the periodic refresh: {:?}",
        issued.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_resync_on_the_change_feed_rereads_every_watched_run_at_once() {
    let f = fixture().await;
    let (a, b) = (run(&f).await, run(&f).await);
    let signals = signals(&f.watcher, &[a.clone(), b.clone()]).await;
    cancel_elsewhere(&f, &a).await;
    cancel_elsewhere(&f, &b).await;
    let reads = f.status_reads();
    let wakes: Vec<_> = signals.iter().map(|s| s.woken()).collect();
    let issued = Instant::now();
    f.store.inner.change_feed().publish(Change::Resync);
    for woken in wakes {
        tokio::time::timeout(WAIT, woken).await.expect("woken");
    }
    assert!(signals.iter().all(|s| s.is_cancelled()));
    assert_eq!(f.status_reads(), reads + 1, "one query for both runs");
    assert!(issued.elapsed() < INTERVAL, "{:?}", issued.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_change_for_a_run_not_watched_reads_nothing() {
    let f = fixture().await;
    let id = run(&f).await;
    let _signal = f.watcher.signal(&id).await;
    let reads = f.status_reads();
    f.store.inner.change_feed().publish(Change::Status {
        run_id: "another-run".into(),
        status: RunState::Cancelled,
    });
    f.hub.wake("another-run");
    tokio::time::sleep(INTERVAL / 2).await;
    assert_eq!(f.status_reads(), reads);
}

#[tokio::test]
async fn the_watcher_stops_when_its_last_handle_and_signal_are_gone() {
    let f = fixture().await;
    let id = run(&f).await;
    let feed = f.store.inner.change_feed();
    let before = feed.receivers();
    let watcher = StatusWatcher::new(
        f.store.clone(),
        Arc::new(CancelHub::new()),
        WatcherConfig::default(),
    );
    assert_eq!(feed.receivers(), before + 1);
    let signal = watcher.signal(&id).await;
    drop(watcher);
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(feed.receivers(), before + 1, "a live signal keeps it");
    drop(signal);
    let mut yields = 0;
    while feed.receivers() > before && yields < 10_000 {
        tokio::task::yield_now().await;
        yields += 1;
    }
    assert_eq!(feed.receivers(), before, "its task ended");
}
