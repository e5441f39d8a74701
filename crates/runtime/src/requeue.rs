//! R9: applying retry decisions. A segment hands its run back (or dead-letters it), and
//! the reaper rescues runs whose lease expired; both read the run, decide with
//! [`RetryPolicy::decide`], and hand the store the decision to apply with one guarded
//! statement that re-checks what was read.

use runwarden_base::StoreError;
use runwarden_mcp::Effect;

use crate::queue::{QueueStore, RequeueAnswer, RequeueApply, RescueApply, Rescued};
use crate::retry::{DeadLetter, RequeueCause, RetryDecision, RetryPolicy};
use crate::state::RunState;
use crate::store::Run;
use crate::time::now_ms;

/// At most this many stale runs per reaper pass.
pub(crate) const REAP_LIMIT: u32 = 100;

/// A decision about a run its segment holds, not applied yet.
#[derive(Debug, Clone)]
pub(crate) struct Decided {
    /// The run as read.
    pub(crate) run: Run,
    /// What to do.
    pub(crate) decision: RetryDecision,
    /// When it was decided.
    pub(crate) now_ms: i64,
    cause: RequeueCause,
}

impl Decided {
    /// The termination reason to store: a dead letter's starts with its code (R9).
    pub(crate) fn reason(&self, why: &str) -> String {
        match self.decision {
            RetryDecision::Requeue { .. } => why.to_string(),
            RetryDecision::DeadLetter(code) => format!("{}: {why}", code.as_str()),
        }
    }
}

/// Reads the run `owner` holds under claim epoch `epoch` and decides what its requeue
/// would do. `Err` answers when the segment no longer holds it: a cancel won (R4), or the
/// lease is lost (R3), to another worker or to a later claim of this one.
pub(crate) async fn decide_held(
    queue: &dyn QueueStore,
    policy: &RetryPolicy,
    id: &str,
    (owner, epoch): (&str, i64),
    cause: RequeueCause,
) -> Result<Result<Decided, RequeueAnswer>, StoreError> {
    let Some(run) = queue.run_get(id).await? else {
        return Ok(Err(RequeueAnswer::LeaseLost));
    };
    if run.status == RunState::Cancelled {
        // R4: cancelled is terminal; no retry path takes it.
        return Ok(Err(RequeueAnswer::AlreadyCancelled));
    }
    if run.status != RunState::Running
        || run.claimed_by.as_deref() != Some(owner)
        || run.claim_epoch != epoch
    {
        // R3: only the segment holding the lease may requeue the run.
        return Ok(Err(RequeueAnswer::LeaseLost));
    }
    let now = now_ms();
    let decision = policy.decide_now(&run, cause, now);
    Ok(Ok(Decided {
        run,
        decision,
        now_ms: now,
        cause,
    }))
}

/// Applies a segment's decision; the guard re-checks the owner, `running`, the requeue
/// count and the pending effect the decision read.
pub(crate) async fn apply_held(
    queue: &dyn QueueStore,
    decided: &Decided,
    owner: &str,
    why: &str,
) -> Result<RequeueAnswer, StoreError> {
    queue
        .run_requeue_apply(RequeueApply {
            id: decided.run.id.clone(),
            owner: owner.to_string(),
            epoch: decided.run.claim_epoch,
            requeue_count: decided.run.requeue_count,
            pending_effect: decided.run.pending_effect.clone(),
            decision: decided.decision,
            reason: decided.reason(why),
            counts: decided.cause.counts(),
            now_ms: decided.now_ms,
        })
        .await
}

/// One reaper pass (R9): requeue or dead-letter every run whose lease expired, with the
/// same backoff, cap and jitter as a failed attempt.
pub async fn reap(queue: &dyn QueueStore, retry: &RetryPolicy) -> Result<Vec<Rescued>, StoreError> {
    reap_at(queue, retry, now_ms(), REAP_LIMIT, None).await
}

/// [`reap`] at a given instant, for at most `limit` runs; `jitter` fixes the backoff's
/// jitter (tests), `None` draws one per run.
pub async fn reap_at(
    queue: &dyn QueueStore,
    retry: &RetryPolicy,
    now_ms: i64,
    limit: u32,
    jitter: Option<f64>,
) -> Result<Vec<Rescued>, StoreError> {
    let mut rescued = Vec::new();
    for run in queue.run_stale(now_ms, limit).await? {
        let jitter = jitter.unwrap_or_else(fastrand::f64);
        let decision = retry.decide(&run, RequeueCause::LeaseExpired, now_ms, jitter);
        let apply = RescueApply {
            id: run.id.clone(),
            owner: run.claimed_by.clone(),
            requeue_count: run.requeue_count,
            pending_effect: run.pending_effect.clone(),
            decision,
            reason: rescue_reason(&run, decision, retry.max_requeues),
            now_ms,
        };
        // R9: the guard re-checks staleness, owner, count and fence: a heartbeat, a
        // settle, a cancel or another reaper that got there first wins, and this run is
        // skipped.
        if !queue.run_rescue_apply(apply).await? {
            continue;
        }
        let action = match decision {
            RetryDecision::Requeue { .. } => RequeueAnswer::Requeued {
                requeue_count: run.requeue_count.saturating_add(1),
            },
            RetryDecision::DeadLetter(code) => RequeueAnswer::DeadLettered(code),
        };
        rescued.push(Rescued { id: run.id, action });
    }
    // R8: a cancelled run whose segment died gets the final event it never wrote.
    let expired_before = now_ms - crate::events::ORPHAN_GRACE_MS;
    for id in queue
        .run_stopped_orphans(expired_before, now_ms, limit)
        .await?
    {
        tracing::info!(run = %id, "the reaper recorded the stop of a cancelled run whose segment ended");
    }
    Ok(rescued)
}

/// The termination reason the reaper stores.
fn rescue_reason(run: &Run, decision: RetryDecision, max_requeues: u32) -> String {
    let who = run.claimed_by.as_deref().unwrap_or("no segment");
    let code = match decision {
        RetryDecision::Requeue { .. } => return format!("the lease of {who} expired"),
        RetryDecision::DeadLetter(code) => code,
    };
    let why = match code {
        DeadLetter::FencedWrite => format!(
            "the lease of {who} expired while a {} was in flight; it may have run, so the run is never retried",
            Effect::NonIdempotentWrite.as_str()
        ),
        DeadLetter::NotRetryable => {
            format!("the lease of {who} expired and the run has no stored request to retry from")
        }
        DeadLetter::RetriesExhausted => format!(
            "the lease of {who} expired after {} requeues (at most {max_requeues})",
            run.requeue_count
        ),
    };
    format!("{}: {why}", code.as_str())
}
