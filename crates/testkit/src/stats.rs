//! Distributions of measured durations for the benchmarks: nearest-rank percentiles.

use std::time::Duration;

/// Sorted samples with nearest-rank percentiles.
#[derive(Debug, Clone, Default)]
pub struct Dist(Vec<Duration>);

impl Dist {
    /// Sorts the samples.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    /// The `p`-th percentile (0 to 100) by nearest rank; zero when there are no samples.
    pub fn pct(&self, p: f64) -> Duration {
        let n = self.0.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        self.0[rank.clamp(1, n) - 1]
    }

    /// The largest sample.
    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }

    /// The arithmetic mean.
    pub fn mean(&self) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let d = Dist::new((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(
            (d.pct(50.0), d.pct(99.0), d.max(), d.len()),
            (
                Duration::from_millis(50),
                Duration::from_millis(99),
                Duration::from_millis(100),
                100
            )
        );
        assert_eq!(Dist::default().pct(50.0), Duration::ZERO);
    }
}
