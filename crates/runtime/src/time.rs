//! The wall clock as the store keeps it: milliseconds since the Unix epoch.

use std::time::Duration;

pub(crate) use runwarden_base::now_ms;

/// A duration in whole milliseconds, as the store's times are kept.
pub(crate) fn ms(duration: Duration) -> i64 {
    duration.as_millis() as i64
}
