//! The egress client's settings: the policy, the timeouts and how often a cancel is
//! looked for while a call is in flight.

use std::time::Duration;

use crate::guard::EgressPolicy;

/// The longest the vault waits between two questions to a signal that cannot wake while a
/// call is in flight (V6).
pub const MAX_TICK: Duration = Duration::from_millis(100);

/// The default backstop tick for a signal that wakes ([`CancellationSignal::wakes`](crate::CancellationSignal::wakes)): news
/// arrives by the wake-up (the runtime's status watcher also wakes its calls after each
/// periodic refresh that finds a cancel), and this slow poll only covers a wake-up that
/// never came. Idle calls cost one timer wake-up each per tick: at 10,000 idle calls a 1 s
/// tick measured 8.4-8.8 % of a core, 5 s 3.4 % (BENCHMARKS.md, `inflight`).
pub const DEFAULT_BACKSTOP_TICK: Duration = Duration::from_secs(5);

/// The longest backstop tick the client accepts.
pub(crate) const MAX_BACKSTOP_TICK: Duration = Duration::from_secs(5);

/// The grace the wall-clock backstop adds on top of the connect and total timeouts.
pub(super) const BACKSTOP_GRACE: Duration = Duration::from_secs(5);

/// Settings of an [`EgressClient`](super::EgressClient).
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Which private targets the operator admits.
    pub policy: EgressPolicy,
    /// The bound on opening a connection.
    pub connect_timeout: Duration,
    /// The total bound of a request that sets none.
    pub default_timeout: Duration,
    /// How often a signal that cannot wake is asked while a call is in flight; at most
    /// [`MAX_TICK`].
    pub tick: Duration,
    /// How often a signal that wakes is asked besides its wake-ups; at least `tick`, at
    /// most 5 s. Idle in-flight calls cost one timer wake-up each per
    /// backstop tick, so this is what 10,000 idle calls cost.
    pub backstop_tick: Duration,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            policy: EgressPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            default_timeout: Duration::from_secs(30),
            tick: MAX_TICK,
            backstop_tick: DEFAULT_BACKSTOP_TICK,
        }
    }
}
