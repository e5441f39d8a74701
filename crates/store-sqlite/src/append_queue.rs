//! The queue of run events waiting to be committed together (see `append_batch`), kept
//! apart from the store so the store's state can hold it.

use std::collections::VecDeque;
use std::sync::Mutex;

use runwarden_base::StoreError;
use runwarden_runtime::store::EventAppend;
use tokio::sync::oneshot;

/// What an append's caller is told: its sequence number, or `None` when its guard
/// refused it.
pub(crate) type Answer = Result<Option<i64>, StoreError>;

/// One queued append and where its answer goes.
pub(crate) struct Pending {
    pub(crate) append: EventAppend,
    pub(crate) payload: String,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// The appends waiting for a transaction, and whether a task is draining them.
#[derive(Default)]
pub(crate) struct Appends {
    queue: Mutex<Queue>,
}

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) pending: VecDeque<Pending>,
    pub(crate) draining: bool,
}

impl Appends {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Every update is one statement: a panic elsewhere leaves nothing half done.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
