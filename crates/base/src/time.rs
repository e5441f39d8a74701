//! The wall clock as every row stores it.

/// Now, in Unix milliseconds UTC. A clock set before 1970 reads as 0.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_this_code_was_written() {
        // 2026-01-01T00:00:00Z
        assert!(super::now_ms() > 1_767_225_600_000);
    }
}
