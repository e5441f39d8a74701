//! The wall clock as the store keeps it: milliseconds since the Unix epoch.

use std::time::Duration;

/// Now, in milliseconds since the Unix epoch (0 for a clock set before it).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A duration in whole milliseconds, as the store's times are kept.
pub(crate) fn ms(duration: Duration) -> i64 {
    duration.as_millis() as i64
}
