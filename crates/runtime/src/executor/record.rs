//! Recording a step: one event appended under the segment's claim, with the status
//! change that ends the run when it is the last, and the live observer told.

use std::sync::atomic::Ordering;

use runwarden_base::StoreError;

use super::{Executor, Segment};
use crate::events::EventBody;
use crate::progress::ProgressTarget;
use crate::store::{EarlierEvent, EventAppend, RunEnd, RunEvent};
use crate::time::now_ms;

/// How one step's recording went.
pub(super) enum Recorded {
    Stored,
    LostRun,
    Failed(StoreError),
}

impl Recorded {
    pub(super) fn is_lost(&self) -> bool {
        matches!(self, Self::LostRun)
    }
}

impl Executor {
    /// Where the progress and log events of one of the segment's calls go.
    pub(super) fn progress_target(&self, segment: &Segment<'_>) -> ProgressTarget {
        ProgressTarget {
            store: self.store.clone(),
            run_id: segment.run.id.clone(),
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            observer: segment.observer.clone(),
        }
    }

    /// Records one step; with `clear_fence` the write fence is cleared in the same update.
    pub(super) async fn record(
        &self,
        segment: &Segment<'_>,
        body: EventBody,
        clear_fence: bool,
        round: Option<u32>,
    ) -> Recorded {
        self.record_ending(segment, body, clear_fence, round, None)
            .await
    }

    /// [`record`](Self::record), and with `end` the status change that ends the run in
    /// the same transaction (one truth per run).
    pub(super) async fn record_ending(
        &self,
        segment: &Segment<'_>,
        body: EventBody,
        clear_fence: bool,
        round: Option<u32>,
        end: Option<RunEnd>,
    ) -> Recorded {
        self.record_after(segment, None, body, clear_fence, round, end)
            .await
    }

    /// [`record_ending`](Self::record_ending), with `before` stored just before `body`
    /// in the same transaction (a final answer's step before the run's end).
    pub(super) async fn record_after(
        &self,
        segment: &Segment<'_>,
        before: Option<EventBody>,
        body: EventBody,
        clear_fence: bool,
        round: Option<u32>,
        end: Option<RunEnd>,
    ) -> Recorded {
        let time_ms = now_ms();
        let before = before.map(|b| EarlierEvent {
            kind: b.kind().to_string(),
            payload: b.to_payload(),
        });
        let append = EventAppend {
            id: segment.run.id.clone(),
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            kind: body.kind().to_string(),
            payload: body.to_payload(),
            clear_fence,
            round,
            end,
            now_ms: time_ms,
            before,
        };
        let is_final = crate::events::is_final_kind(&append.kind);
        // What the live observer is told, kept only when there is one to tell.
        let told = segment.observer.as_ref().map(|_| {
            let earlier = append.before.clone().map(|e| (e.kind, e.payload));
            (earlier, append.kind.clone(), append.payload.clone())
        });
        let seq = match self.store.run_event_append(append).await {
            Ok(Some(seq)) => seq,
            Ok(None) => return Recorded::LostRun,
            Err(error) => return Recorded::Failed(error),
        };
        if is_final {
            segment.ended.store(true, Ordering::SeqCst);
        }
        if let (Some(observer), Some((earlier, kind, payload))) = (&segment.observer, told) {
            let earlier = earlier.map(|(kind, payload)| (seq - 1, kind, payload));
            for (seq, kind, payload) in earlier.into_iter().chain([(seq, kind, payload)]) {
                observer(&RunEvent {
                    run_id: segment.run.id.clone(),
                    seq,
                    kind,
                    payload,
                    time_ms,
                });
            }
        }
        Recorded::Stored
    }

    /// Records a step where a failure to record is tolerated (R8: read-only steps stay
    /// fail-soft); `None` means the segment lost the run and must stop.
    pub(super) async fn record_soft(
        &self,
        segment: &Segment<'_>,
        body: EventBody,
        round: Option<u32>,
    ) -> Option<()> {
        let kind = body.kind();
        match self.record(segment, body, false, round).await {
            Recorded::Stored => Some(()),
            Recorded::LostRun => None,
            Recorded::Failed(error) => {
                tracing::warn!(run = %segment.run.id, kind, %error, "could not record a step; going on");
                Some(())
            }
        }
    }
}
