//! The segment's hold on its run: the heartbeat that renews its lease, and the signal
//! every call of the segment carries (a cancel, a lost lease or a spent budget stops it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Executor, Segment, TaskGuard};
use crate::signal::RunSignal;
use crate::store::{Heartbeat, Run};
use crate::time::{ms, now_ms};

impl Executor {
    /// R6 (amended): the call's signal, whose first answer is a read made now, before the
    /// call reaches the vault (and so before any secret is touched).
    pub(super) async fn signal(&self, segment: &Segment<'_>) -> RunSignal {
        self.watcher
            .signal(&segment.run.id)
            .await
            .with_stop(segment.lease_lost.clone())
            // R13: a budget that runs out stops the call like a cancel.
            .with_stop(segment.budget.flag())
    }

    /// Renews the lease in the background while calls are in flight; a renewal that
    /// matches no row marks the lease lost and stops in-flight calls at once (R3).
    ///
    /// Each renewal is bounded by half a beat, so a store that hangs cannot hold the
    /// heartbeat. When renewals keep failing and the lease as last confirmed could run out
    /// before the next renewal answers, the segment fences itself: it stops its calls and starts no
    /// new request (the lease is treated as lost), says so at WARN with the cause, and
    /// leaves the run to the reaper once the lease has run out.
    pub(super) fn heartbeat(&self, run: &Run, lease_lost: Arc<AtomicBool>) -> TaskGuard {
        let (store, hub, config, id) = (
            self.store.clone(),
            self.hub.clone(),
            self.config.clone(),
            run.id.clone(),
        );
        // The lease the claim confirmed; a run without one (executed directly) has a
        // fresh lease from now.
        let mut held_until = run
            .lease_expires_ms
            .unwrap_or_else(|| now_ms() + ms(config.lease));
        let epoch = run.claim_epoch;
        TaskGuard(tokio::spawn(async move {
            let mut tick = tokio::time::interval(config.heartbeat);
            tick.tick().await; // the first tick is immediate; the lease is fresh
            loop {
                tick.tick().await;
                let now = now_ms();
                let beat = Heartbeat {
                    id: id.clone(),
                    owner: config.owner.clone(),
                    epoch,
                    lease_until_ms: now + ms(config.lease),
                    now_ms: now,
                };
                let lease_until = beat.lease_until_ms;
                let bound = config.heartbeat / 2;
                let cause = match tokio::time::timeout(bound, store.run_heartbeat(beat)).await {
                    Ok(Ok(true)) => {
                        held_until = lease_until;
                        continue;
                    }
                    Ok(Ok(false)) => {
                        lease_lost.store(true, Ordering::SeqCst);
                        hub.wake(&id);
                        return;
                    }
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("the store did not answer the renewal within {bound:?}"),
                };
                // Self-fencing: another worker may claim the run once the lease runs out.
                // The next renewal could answer as late as a beat and a half from now, so
                // the segment stops unless the lease outlasts that.
                if now_ms() + ms(config.heartbeat + bound) >= held_until {
                    tracing::warn!(run = %id, %cause, "the lease could not be renewed and runs out soon; this worker stops the run's calls and starts no new request for it");
                    lease_lost.store(true, Ordering::SeqCst);
                    hub.wake(&id);
                    return;
                }
                tracing::warn!(run = %id, %cause, "the heartbeat could not renew the lease; trying again at the next beat");
            }
        }))
    }
}
