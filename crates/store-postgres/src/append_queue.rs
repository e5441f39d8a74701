//! The queue of run events waiting to share a transaction (see `append_batch`), kept
//! apart from the store so the store's state can hold it, and the rule that picks the
//! next batch from it.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use runwarden_base::StoreError;
use runwarden_runtime::store::EventAppend;
use tokio::sync::oneshot;

/// What an append's caller is told: its sequence number, or `None` when its guard
/// refused it.
pub(crate) type Answer = Result<Option<i64>, StoreError>;

/// The most appends one transaction takes; the rest wait for the next.
pub(crate) const MAX_BATCH: usize = 64;

/// An append waiting for a transaction, with its payload as stored and where its answer
/// goes.
pub(crate) struct Pending {
    pub(crate) append: EventAppend,
    pub(crate) payload: String,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// The appends waiting, and how many append transactions are open.
#[derive(Default)]
pub(crate) struct Appends {
    queue: Mutex<Queue>,
}

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) pending: VecDeque<Pending>,
    pub(crate) in_flight: usize,
}

impl Appends {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every update is one statement: a panic elsewhere leaves nothing half done.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Queue {
    /// The next batch: the oldest append of each run, up to [`MAX_BATCH`]. A second
    /// append of a run already in the batch waits for the next one, so each run's row is
    /// guarded once per transaction.
    pub(crate) fn take_batch(&mut self) -> Vec<Pending> {
        let mut runs = HashSet::new();
        let mut batch = Vec::new();
        let mut rest = VecDeque::new();
        while let Some(p) = self.pending.pop_front() {
            if batch.len() < MAX_BATCH && runs.insert(p.append.id.clone()) {
                batch.push(p);
            } else {
                rest.push_back(p);
            }
        }
        self.pending = rest;
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(run: &str, n: i64) -> Pending {
        Pending {
            append: EventAppend {
                id: run.into(),
                owner: "worker-a".into(),
                epoch: 1,
                kind: "tool_executed".into(),
                payload: serde_json::json!({}),
                clear_fence: false,
                round: None,
                end: None,
                now_ms: n,
                before: None,
            },
            payload: String::new(),
            reply: oneshot::channel().0,
        }
    }

    fn names(batch: &[Pending]) -> Vec<(String, i64)> {
        batch
            .iter()
            .map(|p| (p.append.id.clone(), p.append.now_ms))
            .collect()
    }

    #[test]
    fn a_batch_takes_each_runs_oldest_append_and_leaves_the_rest_in_order() {
        let mut queue = Queue::default();
        for (run, n) in [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("a", 5), ("b", 6)] {
            queue.pending.push_back(pending(run, n));
        }
        let first = queue.take_batch();
        assert_eq!(
            names(&first),
            [("a".into(), 1), ("b".into(), 2), ("c".into(), 4)]
        );
        let second = queue.take_batch();
        assert_eq!(names(&second), [("a".into(), 3), ("b".into(), 6)]);
        let third = queue.take_batch();
        assert_eq!(names(&third), [("a".into(), 5)]);
        assert!(queue.take_batch().is_empty() && queue.pending.is_empty());
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_appends() {
        let mut queue = Queue::default();
        for n in 0..(MAX_BATCH as i64 + 3) {
            queue.pending.push_back(pending(&format!("run-{n}"), n));
        }
        assert_eq!(queue.take_batch().len(), MAX_BATCH);
        let rest = queue.take_batch();
        assert_eq!(
            names(&rest)[0],
            (format!("run-{MAX_BATCH}"), MAX_BATCH as i64)
        );
        assert_eq!(rest.len(), 3);
    }
}
