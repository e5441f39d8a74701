//! M3: one deadline per operation, spent across its legs, on a monotonic clock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A monotonic clock. Tests use [`ManualClock`] to make time pass on cue.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed origin; never goes backwards.
    fn now(&self) -> Duration;
}

/// The process's monotonic clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to, for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Mutex<Duration>,
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The budget of one operation (handshake legs plus the work), started once.
pub(crate) struct Deadline<'c> {
    clock: &'c dyn Clock,
    started: Duration,
    budget: Duration,
}

/// The least a leg is granted; below it the leg is not sent (M3).
const MIN_LEG: Duration = Duration::from_secs(1);

impl<'c> Deadline<'c> {
    pub(crate) fn start(clock: &'c dyn Clock, budget: Duration) -> Self {
        Self {
            clock,
            started: clock.now(),
            budget,
        }
    }

    /// The whole budget, for error messages.
    pub(crate) fn budget(&self) -> Duration {
        self.budget
    }

    /// What is left of the budget.
    pub(crate) fn remaining(&self) -> Duration {
        self.budget
            .saturating_sub(self.clock.now().saturating_sub(self.started))
    }

    /// M3: the next leg is granted what is left, rounded up to whole seconds; `None` when
    /// less than a second is left, in which case the leg must not be sent.
    pub(crate) fn grant(&self) -> Option<Duration> {
        let left = self.remaining();
        if left < MIN_LEG {
            return None;
        }
        let whole = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        Some(Duration::from_secs(whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_leg_is_granted_what_is_left_rounded_up() {
        let clock = ManualClock::default();
        let deadline = Deadline::start(&clock, Duration::from_secs(20));
        assert_eq!(deadline.grant(), Some(Duration::from_secs(20)));
        clock.advance(Duration::from_millis(6_200));
        assert_eq!(
            deadline.grant(),
            Some(Duration::from_secs(14)),
            "13.8 s left rounds up to 14 s"
        );
    }

    #[test]
    fn less_than_a_second_left_grants_nothing() {
        let clock = ManualClock::default();
        let deadline = Deadline::start(&clock, Duration::from_secs(20));
        clock.advance(Duration::from_millis(19_001));
        assert_eq!(deadline.grant(), None);
        clock.advance(Duration::from_secs(5));
        assert_eq!(deadline.remaining(), Duration::ZERO);
    }
}
