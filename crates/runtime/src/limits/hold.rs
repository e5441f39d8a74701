//! A call's hold on its concurrency limits: renewed while the call runs, let go on every
//! path (an explicit release, or a drop when the call ends by error, cancel or panic).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::store::LimitStore;
use crate::time::{ms, now_ms};

/// What a hold lets go of.
struct Held {
    holder: String,
    store: Arc<dyn LimitStore>,
    /// Wakes this process's waiters once the release is stored.
    released: Arc<Notify>,
    renew: JoinHandle<()>,
}

/// The limits one call took. A hold on a concurrency limit is a row with a lease: a task
/// renews it at a third of the lease while the hold lives, and dropping the hold deletes
/// it (a process killed outright frees it when the lease runs out). A take of rate limits
/// only holds nothing.
pub struct Hold {
    held: Option<Held>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("holder", &self.held.as_ref().map(|h| h.holder.as_str()))
            .finish()
    }
}

impl Hold {
    /// A take that holds no slot.
    pub(crate) fn nothing() -> Self {
        Self { held: None }
    }

    /// A take that holds slots under `holder`, renewed every third of `lease`.
    pub(crate) fn slots(
        holder: String,
        store: Arc<dyn LimitStore>,
        released: Arc<Notify>,
        lease: Duration,
    ) -> Self {
        let renew = tokio::spawn(renew(holder.clone(), store.clone(), lease));
        Self {
            held: Some(Held {
                holder,
                store,
                released,
                renew,
            }),
        }
    }

    /// True when the take holds a slot.
    pub fn holds_slots(&self) -> bool {
        self.held.is_some()
    }

    /// Lets go now and waits until the release is stored (or failed: the lease then frees
    /// the slot).
    pub async fn release(mut self) {
        if let Some(held) = self.held.take() {
            let_go(held).await;
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        held.renew.abort();
        // A drop cannot wait: the release runs on its own. Outside a runtime (a process
        // ending) nothing can run it, and the lease frees the slot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(let_go(held));
        }
    }
}

async fn let_go(held: Held) {
    held.renew.abort();
    if let Err(error) = held.store.limit_release(&held.holder).await {
        tracing::warn!(%error, "could not release a limit's slot; it frees itself when its lease runs out");
    }
    held.released.notify_waiters();
}

/// Keeps a hold's lease ahead of the clock while it lives.
async fn renew(holder: String, store: Arc<dyn LimitStore>, lease: Duration) {
    let every = lease / 3;
    loop {
        tokio::time::sleep(every).await;
        let until = now_ms() + ms(lease);
        if let Err(error) = store.limit_renew(&holder, until).await {
            tracing::warn!(%error, "could not renew a limit's slot; trying again");
        }
    }
}
