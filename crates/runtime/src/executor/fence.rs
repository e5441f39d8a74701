//! The write fence: stamped right before a write leaves, cleared when its step is
//! recorded. A write whose step never reached the log keeps its fence, so no retry and no
//! reaper re-sends a non-idempotent one.

use std::sync::{Arc, Mutex};

use runwarden_base::StoreError;
use runwarden_mcp::{CallGate, Effect};

use super::{Executor, Segment};
use crate::agent::BoundTool;
use crate::retry::DeadLetter;
use crate::state::{Outcome, RunState};
use crate::store::FenceMark;
use crate::time::{ms, now_ms};

impl Executor {
    /// R8: a write reached the server but its step is not in the log. A non-idempotent one
    /// may never run again: the run fails with its fence in place, so no path (a retry,
    /// the reaper) re-sends it. An idempotent one may: the run is retried.
    pub(super) async fn unrecorded_write(
        &self,
        segment: &Segment<'_>,
        effect: Effect,
        reason: String,
    ) -> Outcome {
        if effect == Effect::NonIdempotentWrite {
            let reason = format!("{}: {reason}", DeadLetter::FencedWrite.as_str());
            self.settle(segment, RunState::Failed, reason).await
        } else {
            self.fail(segment, reason, true).await
        }
    }

    /// R7, R11: the gate the MCP client runs once the session is ready and before
    /// `tools/call` leaves: stamps the pending effect and renews the lease. A refusal (no
    /// lease, a cancelled run, a store failure) stops the call unsent and leaves what went
    /// wrong in `failure` for [`fence_failed`](Self::fence_failed).
    pub(super) fn fence_gate(
        &self,
        segment: &Segment<'_>,
        tool: &BoundTool,
        failure: Arc<Mutex<Option<FenceFailure>>>,
    ) -> CallGate {
        let store = self.store.clone();
        let (id, owner) = (segment.run.id.clone(), self.config.owner.clone());
        let epoch = segment.run.claim_epoch;
        let (effect, lease) = (tool.effect.as_str().to_string(), self.config.lease);
        CallGate::new(move || {
            let (store, failure) = (store.clone(), failure.clone());
            let now = now_ms();
            let mark = FenceMark {
                id: id.clone(),
                owner: owner.clone(),
                epoch,
                effect: effect.clone(),
                lease_until_ms: now + ms(lease),
                now_ms: now,
            };
            Box::pin(async move {
                let refused = match store.run_fence_mark(mark).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => FenceFailure::NoLease,
                    Err(error) => FenceFailure::Store(error),
                };
                let reason = refused.to_string();
                *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(refused);
                Err(reason)
            })
        })
    }

    /// Ends the segment after the fence could not be stamped; the write was not sent.
    pub(super) async fn fence_failed(
        &self,
        segment: &Segment<'_>,
        failure: FenceFailure,
    ) -> Outcome {
        match failure {
            FenceFailure::NoLease => self.must_stop(segment).await.unwrap_or(Outcome::LeaseLost),
            FenceFailure::Store(error) => {
                // Without the mark the write would be unfenced: it was refused (fail
                // closed). Nothing was sent, so a retry is safe.
                tracing::error!(run = %segment.run.id, %error, "could not stamp the write fence; the write was not made");
                self.fail(
                    segment,
                    format!("the write fence could not be stamped: {error}"),
                    true,
                )
                .await
            }
        }
    }
}

/// Why the write fence was not stamped.
pub(super) enum FenceFailure {
    /// The segment no longer holds the run (its lease was lost or it was cancelled).
    NoLease,
    /// The store failed.
    Store(StoreError),
}

impl std::fmt::Display for FenceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoLease => {
                f.write_str("the run's lease is no longer held, so the write fence was not stamped")
            }
            Self::Store(error) => write!(f, "the write fence could not be stamped: {error}"),
        }
    }
}
