//! `GET /metrics`: Prometheus text. Runs by status (a gauge, from the store), outbound
//! calls by audit action (a counter, from the audit log) and the latency of in-process
//! cancels (a histogram this process observes).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use runwarden_runtime::{CancelLatencyObserver, RunState};

use super::AppState;
use super::error::ApiError;

/// Upper bounds of the cancel-latency buckets, in seconds. SPEC's goal is p99 <= 10 ms
/// woken in-process, so the low end is fine-grained.
const BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Every status, so the gauge has a series for each even when no run is in it.
const STATUSES: [RunState; 6] = [
    RunState::Queued,
    RunState::Running,
    RunState::WaitingForApproval,
    RunState::Completed,
    RunState::Failed,
    RunState::Cancelled,
];

#[derive(Debug, Default)]
struct Histogram {
    /// Observations at or below each bound of [`BUCKETS`] (not cumulative).
    counts: [u64; BUCKETS.len()],
    /// Observations above the last bound.
    over: u64,
    sum: f64,
    count: u64,
}

/// The process's cancel-latency histogram: from a cancel's wake-up through the hub to
/// the cancelled call returning in the executor.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    cancel_latency: Mutex<Histogram>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records one cancel latency.
    pub(crate) fn observe_cancel(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        let mut h = self
            .cancel_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match BUCKETS.iter().position(|bound| seconds <= *bound) {
            Some(i) => h.counts[i] += 1,
            None => h.over += 1,
        }
        h.sum += seconds;
        h.count += 1;
    }

    /// The executor's hook feeding this histogram.
    pub(crate) fn observer(self: &std::sync::Arc<Self>) -> CancelLatencyObserver {
        let metrics = self.clone();
        std::sync::Arc::new(move |latency| metrics.observe_cancel(latency))
    }

    fn write_histogram(&self, out: &mut String) {
        let h = self
            .cancel_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        out.push_str("# HELP runwarden_cancel_latency_seconds Time from a cancel waking a run in this process to its call in flight returning.\n");
        out.push_str("# TYPE runwarden_cancel_latency_seconds histogram\n");
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(h.counts) {
            cumulative += n;
            let _ = writeln!(
                out,
                "runwarden_cancel_latency_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "runwarden_cancel_latency_seconds_bucket{{le=\"+Inf\"}} {}",
            cumulative + h.over
        );
        let _ = writeln!(out, "runwarden_cancel_latency_seconds_sum {}", h.sum);
        let _ = writeln!(out, "runwarden_cancel_latency_seconds_count {}", h.count);
    }
}

/// A label value as the text format wants it.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole exposition, from the given counts and the histogram.
fn render(runs: &[(RunState, u64)], calls: &[(String, u64)], metrics: &Metrics) -> String {
    let mut out = String::new();
    out.push_str("# HELP runwarden_runs Runs in each status.\n# TYPE runwarden_runs gauge\n");
    for status in STATUSES {
        let n = runs
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n);
        let _ = writeln!(out, "runwarden_runs{{status=\"{}\"}} {n}", status.as_str());
    }
    out.push_str("# HELP runwarden_outbound_calls_total Outbound calls by audit action (http_call_started counts calls that reached the network, the other actions their outcomes).\n# TYPE runwarden_outbound_calls_total counter\n");
    for (action, n) in calls {
        let _ = writeln!(
            out,
            "runwarden_outbound_calls_total{{action=\"{}\"}} {n}",
            label(action)
        );
    }
    metrics.write_histogram(&mut out);
    out
}

pub(super) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let runs = state.runs.run_counts().await?;
    let calls = state.audit.audit_counts().await?;
    let text = render(&runs, &calls, &state.metrics);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_status_each_action_and_cumulative_buckets() {
        let metrics = Metrics::new();
        metrics.observe_cancel(Duration::from_micros(400));
        metrics.observe_cancel(Duration::from_millis(30));
        metrics.observe_cancel(Duration::from_secs(5));
        let text = render(
            &[(RunState::Running, 2)],
            &[("http_call".into(), 7)],
            &metrics,
        );
        for line in [
            "runwarden_runs{status=\"running\"} 2",
            "runwarden_runs{status=\"queued\"} 0",
            "runwarden_outbound_calls_total{action=\"http_call\"} 7",
            "runwarden_cancel_latency_seconds_bucket{le=\"0.001\"} 1",
            "runwarden_cancel_latency_seconds_bucket{le=\"0.025\"} 1",
            "runwarden_cancel_latency_seconds_bucket{le=\"0.05\"} 2",
            "runwarden_cancel_latency_seconds_bucket{le=\"2.5\"} 2",
            "runwarden_cancel_latency_seconds_bucket{le=\"+Inf\"} 3",
            "runwarden_cancel_latency_seconds_count 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
