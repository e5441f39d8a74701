//! R9: retrying queued runs: exponential backoff with jitter, a requeue budget, and the
//! decision (River's `makeRetryDecision`) between another attempt and a dead letter. The
//! decision is made here, on the run as read; a store only applies it with one guarded
//! statement that re-checks what it was based on.

use std::time::Duration;

use runwarden_mcp::Effect;

use crate::store::Run;

/// How often, and how far apart, a queued run is retried after a retryable failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// At most this many requeues, shared with the reaper's reclaims of stale runs (R9).
    pub max_requeues: u32,
    /// The delay before the first retry; each retry doubles it.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_requeues: 3,
            base: Duration::from_secs(2),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The ceiling of the delay before retry number `attempt + 1`: `base * 2^attempt`,
    /// capped at `max`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(20));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The delay with "equal jitter": half the ceiling, plus up to the other half at
    /// random (`jitter` in 0..1), so workers retrying together spread out.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        ceiling / 2 + ceiling.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
    }

    /// [`delay`](Self::delay) with a random jitter.
    pub fn random_delay(&self, attempt: u32) -> Duration {
        self.delay(attempt, fastrand::f64())
    }
}

/// Why a run is leaving its segment for the queue; it sets the delay and whether the
/// attempt spends the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequeueCause {
    /// A retryable failure of the segment (5xx, 429, timeout, transport): spends the
    /// budget and waits the backoff (R9).
    Failure,
    /// The reaper found the lease expired: spends the same budget and waits the same
    /// backoff, with the same cap and jitter (R9).
    LeaseExpired,
    /// A graceful stop handed the run back: due at once, and not a failed attempt.
    Drain,
    /// Something the run needs is unavailable for now (the agent cannot be built while
    /// the store is locked): waits the backoff, and is not a failed attempt.
    Unavailable,
}

impl RequeueCause {
    /// True when the attempt spends the requeue budget.
    pub fn counts(self) -> bool {
        matches!(self, Self::Failure | Self::LeaseExpired)
    }
}

/// Why a run was failed for good (R9). Written at the start of its termination reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetter {
    /// The failure will not heal on retry (4xx, auth, configuration, an unrecorded write),
    /// or the run has no stored request to retry from.
    NotRetryable,
    /// The requeue budget is spent.
    RetriesExhausted,
    /// A NON_IDEMPOTENT_WRITE was in flight: it may have run, so it is never retried.
    FencedWrite,
}

impl DeadLetter {
    /// The stable code that starts the termination reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotRetryable => "NOT_RETRYABLE",
            Self::RetriesExhausted => "RETRIES_EXHAUSTED",
            Self::FencedWrite => "FENCED_WRITE",
        }
    }
}

/// What to do with a run leaving its segment (River's `makeRetryDecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Back to the queue, due at this instant (Unix milliseconds UTC).
    Requeue {
        /// When the next attempt may start.
        retry_at_ms: i64,
    },
    /// Failed for good, for this reason.
    DeadLetter(DeadLetter),
}

impl RetryPolicy {
    /// R9: decides, on `run` as read, whether it goes back to the queue or is failed for
    /// good. `jitter` (0..1) spreads the backoff; [`decide_now`](Self::decide_now) draws it.
    ///
    /// In order: a fenced NON_IDEMPOTENT_WRITE is never retried, whatever the budget or the
    /// cause; a run with no stored request has nothing to retry from; a counting attempt
    /// beyond the budget is exhausted; anything else is requeued after its delay.
    pub fn decide(
        &self,
        run: &Run,
        cause: RequeueCause,
        now_ms: i64,
        jitter: f64,
    ) -> RetryDecision {
        if run.pending_effect.as_deref() == Some(Effect::NonIdempotentWrite.as_str()) {
            // R9: the write may have run. An idempotent write may run again, so its mark
            // does not stop a requeue.
            return RetryDecision::DeadLetter(DeadLetter::FencedWrite);
        }
        if run.request.is_none() {
            return RetryDecision::DeadLetter(DeadLetter::NotRetryable);
        }
        if cause.counts() && run.requeue_count >= self.max_requeues {
            return RetryDecision::DeadLetter(DeadLetter::RetriesExhausted);
        }
        let delay = match cause {
            RequeueCause::Drain => Duration::ZERO,
            _ => self.delay(run.requeue_count, jitter),
        };
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        RetryDecision::Requeue {
            retry_at_ms: now_ms.saturating_add(delay_ms),
        }
    }

    /// [`decide`](Self::decide) with a random jitter.
    pub fn decide_now(&self, run: &Run, cause: RequeueCause, now_ms: i64) -> RetryDecision {
        self.decide(run, cause, now_ms, fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RunState;
    use serde_json::json;

    const NOW: i64 = 1_700_000_000_000;

    fn held(requeue_count: u32) -> Run {
        Run {
            id: "r".into(),
            agent: "helper".into(),
            status: RunState::Running,
            termination_reason: None,
            request: Some(json!({"prompt": "go"})),
            claimed_by: Some("w".into()),
            claim_epoch: 1,
            lease_expires_ms: Some(NOW),
            pending_effect: None,
            requeue_count,
            rounds: 1,
            correlation: "r".into(),
            created_ms: NOW,
            updated_ms: NOW,
            origin: Default::default(),
        }
    }

    fn fenced(effect: Effect) -> Run {
        Run {
            pending_effect: Some(effect.as_str().into()),
            ..held(0)
        }
    }

    const ALL_CAUSES: [RequeueCause; 4] = [
        RequeueCause::Failure,
        RequeueCause::LeaseExpired,
        RequeueCause::Drain,
        RequeueCause::Unavailable,
    ];

    #[test]
    fn a_fenced_non_idempotent_write_is_dead_lettered_for_every_cause_and_budget() {
        let generous = RetryPolicy {
            max_requeues: u32::MAX,
            ..RetryPolicy::default()
        };
        for cause in ALL_CAUSES {
            assert_eq!(
                generous.decide(&fenced(Effect::NonIdempotentWrite), cause, NOW, 0.5),
                RetryDecision::DeadLetter(DeadLetter::FencedWrite),
                "R9: {cause:?}"
            );
        }
    }

    #[test]
    fn a_fenced_idempotent_write_may_be_requeued() {
        let decision = RetryPolicy::default().decide(
            &fenced(Effect::IdempotentWrite),
            RequeueCause::Failure,
            NOW,
            0.0,
        );
        assert_eq!(
            decision,
            RetryDecision::Requeue {
                retry_at_ms: NOW + 1_000
            }
        );
    }

    #[test]
    fn a_run_without_its_request_is_not_retryable_for_every_cause() {
        let run = Run {
            request: None,
            ..held(0)
        };
        for cause in ALL_CAUSES {
            assert_eq!(
                RetryPolicy::default().decide(&run, cause, NOW, 0.5),
                RetryDecision::DeadLetter(DeadLetter::NotRetryable),
                "{cause:?}"
            );
        }
    }

    #[test]
    fn failures_and_expired_leases_spend_one_shared_budget() {
        let policy = RetryPolicy::default(); // 3 requeues
        for cause in [RequeueCause::Failure, RequeueCause::LeaseExpired] {
            assert!(matches!(
                policy.decide(&held(2), cause, NOW, 0.5),
                RetryDecision::Requeue { .. }
            ));
            assert_eq!(
                policy.decide(&held(3), cause, NOW, 0.5),
                RetryDecision::DeadLetter(DeadLetter::RetriesExhausted),
                "R9: at most 3 requeues ({cause:?})"
            );
        }
    }

    #[test]
    fn a_drain_or_an_unavailable_agent_never_exhausts_the_budget() {
        let none_left = RetryPolicy {
            max_requeues: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(
            none_left.decide(&held(7), RequeueCause::Drain, NOW, 0.9),
            RetryDecision::Requeue { retry_at_ms: NOW },
            "a drained run is due at once"
        );
        assert!(matches!(
            none_left.decide(&held(7), RequeueCause::Unavailable, NOW, 0.9),
            RetryDecision::Requeue { retry_at_ms } if retry_at_ms > NOW
        ));
    }

    #[test]
    fn the_reaper_backs_off_like_a_failure_with_the_same_cap_and_jitter() {
        let policy = RetryPolicy {
            max_requeues: 100,
            base: Duration::from_millis(100),
            max: Duration::from_millis(1_000),
        };
        for count in 0..8 {
            for jitter in [0.0, 0.25, 1.0] {
                let failure = policy.decide(&held(count), RequeueCause::Failure, NOW, jitter);
                let stale = policy.decide(&held(count), RequeueCause::LeaseExpired, NOW, jitter);
                assert_eq!(stale, failure, "one backoff for both paths");
            }
            let RetryDecision::Requeue { retry_at_ms: low } =
                policy.decide(&held(count), RequeueCause::LeaseExpired, NOW, 0.0)
            else {
                panic!("requeued")
            };
            let RetryDecision::Requeue { retry_at_ms: high } =
                policy.decide(&held(count), RequeueCause::LeaseExpired, NOW, 1.0)
            else {
                panic!("requeued")
            };
            let ceiling = (100_i64 << count).min(1_000);
            assert_eq!(high - NOW, ceiling, "capped at max after {count} requeues");
            assert_eq!(low - NOW, ceiling / 2, "equal jitter: at least half");
        }
    }

    #[test]
    fn the_decision_saturates_instead_of_overflowing() {
        let policy = RetryPolicy {
            max_requeues: u32::MAX,
            base: Duration::from_secs(u64::MAX / 4),
            max: Duration::MAX,
        };
        assert_eq!(
            policy.decide(&held(40), RequeueCause::Failure, i64::MAX - 5, 1.0),
            RetryDecision::Requeue {
                retry_at_ms: i64::MAX
            }
        );
    }

    #[test]
    fn the_backoff_doubles_until_its_cap() {
        let policy = RetryPolicy {
            max_requeues: 3,
            base: Duration::from_secs(2),
            max: Duration::from_secs(10),
        };
        let ceilings: Vec<u64> = (0..5).map(|a| policy.ceiling(a).as_secs()).collect();
        assert_eq!(ceilings, [2, 4, 8, 10, 10]);
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_ceiling() {
        let policy = RetryPolicy::default();
        for attempt in 0..4 {
            let ceiling = policy.ceiling(attempt);
            assert_eq!(policy.delay(attempt, 0.0), ceiling / 2);
            assert_eq!(policy.delay(attempt, 1.0), ceiling);
            for _ in 0..100 {
                let d = policy.random_delay(attempt);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "{d:?} outside [{:?}, {ceiling:?}]",
                    ceiling / 2
                );
            }
        }
    }

    #[test]
    fn huge_attempt_numbers_do_not_overflow() {
        assert_eq!(
            RetryPolicy::default().ceiling(u32::MAX),
            Duration::from_secs(300)
        );
    }
}
