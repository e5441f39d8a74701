//! How a segment ends: stopping at a boundary (a cancel, a lost lease, a spent budget, a
//! draining worker), failing, going back to the queue, or settling the run.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::record::Recorded;
use super::{Executor, Segment};
use crate::events::{EventBody, RunEnded, RunRequeued};
use crate::queue::RequeueAnswer;
use crate::requeue::{apply_held, decide_held};
use crate::retry::{DeadLetter, RequeueCause, RetryDecision};
use crate::signal::{RunSignal, is_run_cancelled};
use crate::state::{Outcome, RunState};
use crate::store::{RunEnd, RunSettle, SettleAnswer};
use crate::time::now_ms;

impl Executor {
    /// A call of the run came back cancelled at `returned`: when the run was cancelled
    /// and the hub woke it, report the time from the wake-up to the return.
    pub(super) fn observe_cancel(
        &self,
        segment: &Segment<'_>,
        returned: Instant,
        outcome: Outcome,
    ) {
        if outcome != Outcome::Cancelled {
            return; // a lost lease also wakes the signal; it is not a cancel
        }
        if let (Some(observer), Some(woken)) =
            (&self.cancel_latency, self.hub.woken_at(&segment.run.id))
        {
            observer(returned.saturating_duration_since(woken));
        }
    }

    /// Why the segment stops at a boundary, if it must: a cancel (R5), a lost lease (R3),
    /// or a budget that ran out (R13), which settles the run as failed with
    /// `BUDGET_EXCEEDED` (never retried; a write's fence stays as after a cancel).
    pub(super) async fn must_stop(&self, segment: &Segment<'_>) -> Option<Outcome> {
        self.must_stop_probing(segment, true).await
    }

    /// [`must_stop`](Self::must_stop); with `probe` false the row is not read again,
    /// because the boundary just before read it and no step ran since.
    async fn must_stop_probing(&self, segment: &Segment<'_>, probe: bool) -> Option<Outcome> {
        if probe && is_run_cancelled(&*self.store, &segment.run.id).await {
            Some(Outcome::Cancelled)
        } else if segment.lease_lost.load(Ordering::SeqCst) {
            Some(Outcome::LeaseLost)
        } else if let Some(reason) = segment.budget.reason() {
            Some(self.settle(segment, RunState::Failed, reason).await)
        } else {
            None
        }
    }

    /// At a step boundary: stop for a cancel or a lost lease, or hand the run back to the
    /// queue when the worker is draining.
    pub(super) async fn boundary(&self, segment: &Segment<'_>) -> Option<Outcome> {
        self.boundary_probing(segment, true).await
    }

    /// [`boundary`](Self::boundary); with `probe` false it does not read the row again
    /// (R5 asks for one read after each step, and the boundary before this one read it).
    pub(super) async fn boundary_probing(
        &self,
        segment: &Segment<'_>,
        probe: bool,
    ) -> Option<Outcome> {
        if let Some(stop) = self.must_stop_probing(segment, probe).await {
            return Some(stop);
        }
        if is_draining(segment) {
            return Some(
                self.requeue(
                    segment,
                    "the worker stopped; the run goes back to the queue".into(),
                    RequeueCause::Drain,
                )
                .await,
            );
        }
        None
    }

    /// [`boundary`](Self::boundary) before a call: the call's signal is taken here, and
    /// the read that answers its first question is the boundary's read of the row (R5,
    /// R6): made after the signal asked, fail-soft like the probe. `Ok` is the signal for
    /// the call.
    pub(super) async fn boundary_signal(
        &self,
        segment: &Segment<'_>,
    ) -> Result<RunSignal, Outcome> {
        let signal = self.signal(segment).await;
        if signal.row_cancelled() {
            return Err(Outcome::Cancelled);
        }
        match self.boundary_probing(segment, false).await {
            Some(stop) => Err(stop),
            None => Ok(signal),
        }
    }

    /// Whether the run may end at this boundary without reading its row: the lease is
    /// held, the budget is not spent and the worker is not draining. The guarded write
    /// that ends the run is then the read (a cancel that won the row refuses it).
    pub(super) fn may_end_here(&self, segment: &Segment<'_>) -> bool {
        !is_draining(segment)
            && !segment.lease_lost.load(Ordering::SeqCst)
            && segment.budget.reason().is_none()
    }

    /// Ends a segment for a failure: a queued run with a retry policy is requeued when the
    /// failure is retryable and dead-lettered (`NOT_RETRYABLE`) when it is not (R9); a
    /// synchronous run is settled as failed.
    pub(super) async fn fail(
        &self,
        segment: &Segment<'_>,
        reason: String,
        retryable: bool,
    ) -> Outcome {
        match (&segment.options.retry, retryable) {
            (None, _) => self.settle(segment, RunState::Failed, reason).await,
            (Some(_), true) => self.requeue(segment, reason, RequeueCause::Failure).await,
            (Some(_), false) => {
                let reason = format!("{}: {reason}", DeadLetter::NotRetryable.as_str());
                match self.settle(segment, RunState::Failed, reason).await {
                    Outcome::Failed => Outcome::DeadLettered,
                    other => other,
                }
            }
        }
    }

    /// Puts the run back in the queue, or dead-letters it, as the retry policy decides on
    /// the run read now (R9); the store applies a requeue with a guard that re-checks
    /// what was read. The step says which: `run_requeued`, or `run_failed` for a dead
    /// letter (written with the status change that ends the run).
    pub(super) async fn requeue(
        &self,
        segment: &Segment<'_>,
        reason: String,
        cause: RequeueCause,
    ) -> Outcome {
        let Some(queue) = self.queue.clone() else {
            return self.settle(segment, RunState::Failed, reason).await;
        };
        let policy = segment.options.retry.unwrap_or_default();
        let owner = &self.config.owner;
        let held = (owner.as_str(), segment.run.claim_epoch);
        let decided = match decide_held(&*queue, &policy, &segment.run.id, held, cause).await {
            Ok(Ok(decided)) => decided,
            Ok(Err(answer)) => return requeue_outcome(answer),
            Err(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                tracing::error!(run = %segment.run.id, %error, "could not read the run to requeue it; its lease will run out");
                return Outcome::LeaseLost;
            }
        };
        let body = match decided.decision {
            RetryDecision::Requeue { retry_at_ms } => EventBody::RunRequeued(RunRequeued {
                reason: reason.clone(),
                counts: cause.counts(),
                retry_in_ms: u64::try_from(retry_at_ms.saturating_sub(decided.now_ms)).unwrap_or(0),
            }),
            RetryDecision::DeadLetter(_) => {
                // The dead letter is the run's end: its final step and its status go in
                // one transaction, under this segment's claim (which no one else can
                // change the count or the fence under).
                let reason = decided.reason(&reason);
                return match self.settle(segment, RunState::Failed, reason).await {
                    Outcome::Failed => Outcome::DeadLettered,
                    other => other,
                };
            }
        };
        if self.record(segment, body, false, None).await.is_lost() {
            return Outcome::LeaseLost;
        }
        match apply_held(&*queue, &decided, owner, &reason).await {
            Ok(answer) => requeue_outcome(answer),
            Err(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                tracing::error!(run = %segment.run.id, %error, "could not requeue the run; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }

    /// Records the terminal step and settles the row in one transaction, so the row and
    /// the log never disagree. When a cancel won the row first, the segment reports the
    /// cancel (the winner's outcome) and records its stop; when the store did not confirm
    /// the write, the run is left to its lease (never reported as failed: a later segment
    /// may still complete it).
    pub(super) async fn settle(
        &self,
        segment: &Segment<'_>,
        status: RunState,
        reason: String,
    ) -> Outcome {
        let ended = RunEnded {
            reason: reason.clone(),
        };
        let body = if status == RunState::Completed {
            EventBody::RunCompleted(ended)
        } else {
            EventBody::RunFailed(ended)
        };
        let end = RunEnd { status, reason };
        match self
            .record_ending(segment, body, false, None, Some(end))
            .await
        {
            Recorded::Stored if status == RunState::Completed => Outcome::Completed,
            Recorded::Stored => Outcome::Failed,
            Recorded::LostRun => {
                if is_run_cancelled(&*self.store, &segment.run.id).await {
                    Outcome::Cancelled // the segment's caller records the stop
                } else {
                    Outcome::LeaseLost
                }
            }
            Recorded::Failed(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                tracing::error!(run = %segment.run.id, %error, "could not record the run's end; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }

    /// Settles the row only: the terminal step is already in the log (R8: a resumed run
    /// whose end was recorded settles from the log and never writes a second one).
    pub(super) async fn settle_row(
        &self,
        segment: &Segment<'_>,
        status: RunState,
        reason: String,
    ) -> Outcome {
        let settle = RunSettle {
            id: segment.run.id.clone(),
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            status,
            reason,
            now_ms: now_ms(),
        };
        match self.store.run_settle(settle).await {
            Ok(SettleAnswer::Settled) if status == RunState::Completed => Outcome::Completed,
            Ok(SettleAnswer::Settled) => Outcome::Failed,
            Ok(SettleAnswer::AlreadyCancelled) => Outcome::Cancelled,
            Ok(SettleAnswer::LeaseLost) => Outcome::LeaseLost,
            Err(error) => {
                // The row stays running; its lease runs out and the reaper decides (R9).
                // Not a failure of the run: a later segment settles it from the log.
                tracing::error!(run = %segment.run.id, %error, "could not settle the run; its lease will run out");
                Outcome::LeaseLost
            }
        }
    }
}

/// Whether the worker is draining: the segment hands its run back at the next boundary.
fn is_draining(segment: &Segment<'_>) -> bool {
    segment
        .options
        .drain
        .as_ref()
        .is_some_and(|d| d.load(Ordering::SeqCst))
}

/// What a requeue's answer means for the segment.
fn requeue_outcome(answer: RequeueAnswer) -> Outcome {
    match answer {
        RequeueAnswer::Requeued { .. } => Outcome::Requeued,
        RequeueAnswer::DeadLettered(_) => Outcome::DeadLettered,
        RequeueAnswer::AlreadyCancelled => Outcome::Cancelled,
        RequeueAnswer::LeaseLost => Outcome::LeaseLost,
    }
}
