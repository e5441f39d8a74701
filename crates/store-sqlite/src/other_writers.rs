//! O6 across processes on one SQLite file: what another process commits is not on this
//! process's change feed. [`SqliteStore::watch_other_writers`] is an opt-in task that asks
//! `PRAGMA data_version` on the write connection every so often and publishes
//! [`Change::Resync`] when it moved. On that connection the number changes only when a
//! *different* connection commits, so this process's own writes (already on the feed) never
//! cause a resync. The question reads a counter in the WAL index: no table, no lock.

use std::sync::Arc;
use std::time::Duration;

use runwarden_runtime::Change;

use crate::cached::Cached;
use crate::connection::SqliteStore;
use crate::failure::Failure;

/// The running watch; dropping it stops the task.
#[derive(Debug)]
pub struct OtherWriters {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtherWriters {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SqliteStore {
    /// Starts the watch: every `every`, one `PRAGMA data_version` (skipped while nobody
    /// subscribes to the feed), and a [`Change::Resync`] when another connection (another
    /// process, or another `SqliteStore` on the same file) committed since the last look.
    /// The first look is taken before this returns, so whatever a subscriber reads after
    /// it is covered: a change committed later reaches the feed within `every` (plus the
    /// wait for the connection). A look that could not be taken, or skipped for want of
    /// subscribers, counts as a change. The task holds the store weakly and ends with it.
    pub async fn watch_other_writers(&self, every: Duration) -> OtherWriters {
        let mut last = data_version(self).await;
        let store = Arc::downgrade(self.inner());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate; the first look is taken
            loop {
                tick.tick().await;
                let Some(inner) = store.upgrade() else {
                    return;
                };
                let store = SqliteStore::from_inner(inner);
                if store.feed().receivers() == 0 {
                    // Nobody to tell. A subscriber reads what it watches after it
                    // subscribes; the next look after a gap reports a change anyway.
                    last = None;
                    continue;
                }
                // A failed look is tried again at the next tick; the feed is only a hint.
                if let Some(version) = data_version(&store).await {
                    if last != Some(version) {
                        store.feed().publish(Change::Resync);
                    }
                    last = Some(version);
                }
            }
        });
        OtherWriters { task }
    }
}

/// The write connection's `PRAGMA data_version`, or `None` when it could not be read.
async fn data_version(store: &SqliteStore) -> Option<i64> {
    store
        .run("reading the data version", |conn| {
            conn.query_row_cached("PRAGMA data_version", [], |row| row.get::<_, i64>(0))
                .map_err(Failure::from)
        })
        .await
        .ok()
}
