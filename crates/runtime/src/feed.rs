//! The change feed (O6): what changed in the run store, pushed to whoever watches, so
//! live views, workers and the status watcher are woken instead of polling.
//!
//! A store owns one [`ChangeFeed`] and publishes to it after each write commits. SQLite
//! publishes what this process wrote (another process on the same file is seen by a slow
//! poll that publishes [`Change::Resync`]); PostgreSQL also forwards its `NOTIFY`s, so a
//! change made on any node reaches every node. A change is a hint: the store stays the
//! only source of truth, and a receiver re-reads what it shows.

use tokio::sync::broadcast;

use crate::state::RunState;

/// How many changes a slow receiver may fall behind before it is told to resync.
pub const FEED_CAPACITY: usize = 4096;

/// One change in the run store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An event was appended to a run.
    Appended {
        /// The run.
        run_id: String,
        /// The event's sequence number.
        seq: i64,
    },
    /// A run's status changed (created, claimed, cancelled, settled, requeued, rescued).
    Status {
        /// The run.
        run_id: String,
        /// Its status after the change.
        status: RunState,
    },
    /// A queued run became claimable: a worker should try to claim.
    Ready,
    /// Something changed that the source cannot name (another process on the same
    /// SQLite file, a lost notification connection, a receiver that fell behind): re-read
    /// everything you watch.
    Resync,
}

/// A broadcast of [`Change`]s. Clones publish to and subscribe from the same feed.
#[derive(Debug, Clone)]
pub struct ChangeFeed {
    tx: broadcast::Sender<Change>,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl ChangeFeed {
    /// A feed with no subscribers.
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(FEED_CAPACITY);
        Self { tx }
    }

    /// Tells every subscriber. Never blocks; with no subscriber the change is dropped.
    pub fn publish(&self, change: Change) {
        let _ = self.tx.send(change);
    }

    /// A receiver of every change published from now on. A receiver that falls more
    /// than [`FEED_CAPACITY`] behind gets `RecvError::Lagged` and must resync.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.tx.subscribe()
    }

    /// How many receivers are subscribed.
    pub fn receivers(&self) -> usize {
        self.tx.receiver_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_subscriber_receives_a_published_change() {
        let feed = ChangeFeed::new();
        let mut a = feed.subscribe();
        let mut b = feed.clone().subscribe();
        feed.publish(Change::Ready);
        assert_eq!(a.recv().await.unwrap(), Change::Ready);
        assert_eq!(b.recv().await.unwrap(), Change::Ready);
        assert_eq!(feed.receivers(), 2);
    }
}
