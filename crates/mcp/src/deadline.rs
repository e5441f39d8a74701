//! M3: one deadline per operation, spent across its legs, on a monotonic clock. The
//! configured budget is the whole operation's: a leg is granted what is left (never more),
//! the first leg always gets its chance, and a later leg is not sent when less than its
//! floor is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A monotonic clock. Tests use [`ManualClock`] to make time pass on cue.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed origin; never goes backwards.
    fn now(&self) -> Duration;
}

/// The process's monotonic clock.
#[derive(Debug)]
pub(crate) struct SystemClock {
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
    /// M15: with `progress_extends_deadline`, the most the operation may last in all.
    hard: Option<Duration>,
    /// The clock time of the last progress notification (shared with the stream reader).
    progress: ProgressCell,
    /// Whether a leg was granted yet: the first one always is.
    granted: AtomicBool,
}

/// Where the stream reader records the clock time of the latest progress (M15).
pub(crate) type ProgressCell = Arc<Mutex<Option<Duration>>>;

/// The least time left for a leg after the first to be sent (M3), for budgets of four
/// seconds and more; a smaller budget's floor is a quarter of it, so a one-second budget
/// still has room for its handshake.
pub(crate) const MIN_LEG: Duration = Duration::from_secs(1);

/// The smallest budget an operation may be configured with: below it a handshake and a
/// call cannot both fit, so the configuration refuses it when it is read.
pub const MIN_BUDGET: Duration = Duration::from_secs(1);

impl<'c> Deadline<'c> {
    pub(crate) fn start(clock: &'c dyn Clock, budget: Duration) -> Self {
        Self {
            clock,
            started: clock.now(),
            budget,
            hard: None,
            progress: ProgressCell::default(),
            granted: AtomicBool::new(false),
        }
    }

    /// M15: a deadline that [`stretch`](Self::stretch) may move, never past `hard` after
    /// the start (a budget above `hard` keeps the budget).
    pub(crate) fn stretchable(clock: &'c dyn Clock, budget: Duration, hard: Duration) -> Self {
        Self {
            hard: Some(hard.max(budget)),
            ..Self::start(clock, budget)
        }
    }

    /// True when progress may move this deadline.
    pub(crate) fn stretches(&self) -> bool {
        self.hard.is_some()
    }

    fn elapsed(&self) -> Duration {
        self.clock.now().saturating_sub(self.started)
    }

    /// M15: a progress notification gives the operation its whole budget again from now,
    /// bounded by the hard maximum. Does nothing on a deadline that does not stretch.
    #[cfg(test)]
    pub(crate) fn stretch(&self) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.clock.now());
    }

    /// The cell the stream reader stamps with the clock's time at each progress.
    pub(crate) fn progress_cell(&self) -> ProgressCell {
        self.progress.clone()
    }

    /// What is left before the hard maximum: the bound a leg of a stretchable operation is
    /// sent with (the soft end is enforced through the signal).
    pub(crate) fn grant_hard(&self) -> Option<Duration> {
        let left = self.hard?.saturating_sub(self.elapsed());
        (!left.is_zero()).then_some(left)
    }

    /// The least that must be left for a leg after the first to be sent.
    pub(crate) fn floor(&self) -> Duration {
        MIN_LEG.min(self.budget / 4)
    }

    /// The whole budget, for error messages.
    pub(crate) fn budget(&self) -> Duration {
        self.budget
    }

    /// What is left of the budget (as progress extended it).
    pub(crate) fn remaining(&self) -> Duration {
        let mut end = self.budget;
        let progress = *self.progress.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(hard), Some(at)) = (self.hard, progress) {
            end = end.max((at.saturating_sub(self.started) + self.budget).min(hard));
        }
        end.saturating_sub(self.elapsed())
    }

    /// M3: the next leg is granted what is left, so the operation never outlasts its
    /// budget. The first leg always gets its chance (a one-second budget can reach a
    /// server); a later one gets `None` when less than [`floor`](Self::floor) is left, and
    /// must then not be sent.
    pub(crate) fn grant(&self) -> Option<Duration> {
        let left = self.remaining();
        let first = !self.granted.swap(true, Ordering::Relaxed);
        if left.is_zero() || (!first && left < self.floor()) {
            return None;
        }
        Some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_leg_is_granted_what_is_left_and_never_more() {
        let clock = ManualClock::default();
        let deadline = Deadline::start(&clock, Duration::from_secs(20));
        assert_eq!(deadline.grant(), Some(Duration::from_secs(20)));
        clock.advance(Duration::from_millis(6_200));
        assert_eq!(
            deadline.grant(),
            Some(Duration::from_millis(13_800)),
            "what is left, so the legs never outlast the budget"
        );
    }

    #[test]
    fn a_one_second_budget_reaches_the_server_and_still_has_room_for_the_call() {
        let clock = ManualClock::default();
        let deadline = Deadline::start(&clock, MIN_BUDGET);
        clock.advance(Duration::from_millis(30));
        assert_eq!(deadline.grant(), Some(Duration::from_millis(970)));
        clock.advance(Duration::from_millis(20));
        assert_eq!(
            deadline.grant(),
            Some(Duration::from_millis(950)),
            "the floor of a one-second budget is a quarter of it"
        );
        clock.advance(Duration::from_millis(800));
        assert_eq!(deadline.grant(), None, "150 ms is under the 250 ms floor");
    }

    #[test]
    fn the_first_leg_always_gets_its_chance() {
        let clock = ManualClock::default();
        let deadline = Deadline::start(&clock, Duration::from_secs(20));
        clock.advance(Duration::from_millis(19_500));
        assert_eq!(deadline.grant(), Some(Duration::from_millis(500)));
        assert_eq!(deadline.grant(), None, "a later leg needs its floor");
    }

    #[test]
    fn progress_restarts_the_budget_only_when_allowed_and_never_past_the_hard_maximum() {
        let clock = ManualClock::default();
        let fixed = Deadline::start(&clock, Duration::from_secs(20));
        let stretchy =
            Deadline::stretchable(&clock, Duration::from_secs(20), Duration::from_secs(50));
        clock.advance(Duration::from_secs(15));
        fixed.stretch();
        stretchy.stretch();
        assert_eq!(
            fixed.remaining(),
            Duration::from_secs(5),
            "no extension by default"
        );
        assert_eq!(stretchy.remaining(), Duration::from_secs(20));
        clock.advance(Duration::from_secs(19));
        stretchy.stretch();
        assert_eq!(
            stretchy.remaining(),
            Duration::from_secs(16),
            "bounded by the 50 s hard maximum"
        );
        assert_eq!(stretchy.grant_hard(), Some(Duration::from_secs(16)));
    }

    #[test]
    fn less_than_a_second_left_grants_nothing() {
        let clock = ManualClock::default();
        let deadline = Deadline::start(&clock, Duration::from_secs(20));
        assert!(deadline.grant().is_some());
        clock.advance(Duration::from_millis(19_001));
        assert_eq!(deadline.grant(), None);
        clock.advance(Duration::from_secs(5));
        assert_eq!(deadline.remaining(), Duration::ZERO);
    }
}
