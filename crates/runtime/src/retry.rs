//! R9: retrying queued runs: exponential backoff with jitter and a requeue budget.

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
