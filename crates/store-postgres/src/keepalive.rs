//! TCP keepalives, set alike on the pool's connections and the listener's.

use std::time::Duration;

/// TCP keepalives on every connection: a peer that vanished without a reset (a
/// partition, a crashed host) is found within about half a minute instead of the
/// kernel's default two hours.
pub(crate) fn keepalives(config: &mut tokio_postgres::Config) {
    config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3);
}
