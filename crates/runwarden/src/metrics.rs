//! This process's metrics registry, which `GET /metrics` renders as OpenMetrics text.
//!
//! Counters and histograms count what this process did (API requests by route and status,
//! the latency of cancels it woke), so two replicas on one database report their own
//! figures. The database-wide figures (runs by status, audit rows by action) are gauges set
//! from the store at each scrape, under names that say so (`runwarden_db_*`).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use runwarden_runtime::limits::{LimitObserver, WaitEnd};
use runwarden_runtime::{CancelLatencyObserver, RunState};

/// Upper bounds of the cancel-latency buckets, in seconds. The goal is p99 <= 10 ms
/// woken in-process, so the low end is fine-grained.
const CANCEL_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Upper bounds of the API latency buckets, in seconds (a live event stream counts until
/// it ends, so the top is long).
const REQUEST_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 60.0,
];

/// One API request's labels: the route's template (never the concrete path), the method
/// and the status.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

/// The labels of the request latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ActionLabels {
    action: String,
}

/// One outbound call's labels: its audit action and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    action: String,
    delivery: String,
}

/// A store error's labels: its kind (`busy`, `read_only`, `disk_full`, ...).
/// A limit wait's labels: how it ended (`taken`, `timed_out`, `cancelled`, `unavailable`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WaitLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// What the metrics read at each scrape from parts built after them.
#[derive(Default)]
struct Sources {
    /// The worker's busy slots, when this process runs workers.
    slots: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// The status watcher, and how many of its queries were counted already.
    watcher: Option<(runwarden_runtime::StatusWatcher, u64)>,
    /// The store errors counted already, per kind.
    store_errors: [u64; 7],
    /// The store's changes of state counted already, per state entered.
    store_states: Vec<(&'static str, u64)>,
}

/// The process's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<RouteLabels, Histogram>,
    cancel_latency: Histogram,
    db_runs: Family<StatusLabels, Gauge>,
    db_audit: Family<ActionLabels, Gauge>,
    calls: Family<CallLabels, Counter>,
    slots_busy: Gauge,
    watcher_queries: Counter,
    store_errors: Family<KindLabels, Counter>,
    store_state_changes: Family<KindLabels, Counter>,
    db_decisions_pending: Gauge,
    limit_waiting: Gauge,
    limit_waits: Family<WaitLabels, Counter>,
    sources: std::sync::Mutex<Sources>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("runwarden");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "API requests this process answered, by route template, method and status",
            requests.clone(),
        );
        let request_seconds =
            Family::<RouteLabels, Histogram>::new_with_constructor(request_histogram as fn() -> _);
        registry.register(
            "http_request_duration_seconds",
            "Time from a request's arrival to its response's head, by route template and method",
            request_seconds.clone(),
        );
        let cancel_latency = Histogram::new(CANCEL_BUCKETS);
        registry.register(
            "cancel_latency_seconds",
            "Time from a cancel waking a run in this process to its call in flight returning",
            cancel_latency.clone(),
        );
        let db_runs = Family::<StatusLabels, Gauge>::default();
        registry.register(
            "db_runs",
            "Runs in each status in the database (every node reports the same figure)",
            db_runs.clone(),
        );
        let db_audit = Family::<ActionLabels, Gauge>::default();
        registry.register(
            "db_audit_rows",
            "Audit rows of outbound calls by action in the database (http_call_started counts calls that reached the network, the other actions their outcomes; every node reports the same figure)",
            db_audit.clone(),
        );
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "outbound_calls",
            "Outbound calls this process made through the vault, by audit action and delivery (not_sent, maybe_delivered, answered)",
            calls.clone(),
        );
        let slots_busy = Gauge::default();
        registry.register(
            "worker_slots_busy",
            "Worker slots of this process executing a run now",
            slots_busy.clone(),
        );
        let watcher_queries = Counter::default();
        registry.register(
            "status_watcher_queries",
            "Batched status reads this process's watcher made",
            watcher_queries.clone(),
        );
        let store_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Store errors this process met, by kind (busy, read_only, disk_full, too_many_files, io, corrupt, other)",
            store_errors.clone(),
        );
        let store_state_changes = Family::<KindLabels, Counter>::default();
        registry.register(
            "store_state_changes",
            "Changes of the store's state found by store calls and the readiness probe, by the state entered (ready, busy, read_only, disk_full, too_many_files, io, corrupt, other, unreachable)",
            store_state_changes.clone(),
        );
        let db_decisions_pending = Gauge::default();
        registry.register(
            "db_decisions_pending",
            "Operator decisions waiting for an answer in the database: one per run waiting for approval (every node reports the same figure)",
            db_decisions_pending.clone(),
        );
        let limit_waiting = Gauge::default();
        registry.register(
            "limit_waiting_calls",
            "Calls of this process waiting now for a full limit (concurrency or rate) before they are sent",
            limit_waiting.clone(),
        );
        let limit_waits = Family::<WaitLabels, Counter>::default();
        registry.register(
            "limit_waits",
            "Waits of this process's calls for a full limit, by how they ended (taken, timed_out, cancelled, unavailable)",
            limit_waits.clone(),
        );
        Self {
            registry,
            requests,
            request_seconds,
            cancel_latency,
            db_runs,
            db_audit,
            calls,
            slots_busy,
            watcher_queries,
            store_errors,
            store_state_changes,
            db_decisions_pending,
            limit_waiting,
            limit_waits,
            sources: std::sync::Mutex::default(),
        }
    }

    /// The egress client's hook: counts each outbound call as it ends.
    pub(crate) fn call_observer(self: &Arc<Self>) -> runwarden_vault::CallObserver {
        let metrics = self.clone();
        Arc::new(move |action, delivery| {
            metrics
                .calls
                .get_or_create(&CallLabels {
                    action: action.to_string(),
                    delivery: delivery.as_str().to_string(),
                })
                .inc();
        })
    }

    /// The limiter's hook: the gauge of waiting calls and the count of waits by outcome.
    pub(crate) fn limit_observer(self: &Arc<Self>) -> Arc<dyn LimitObserver> {
        self.clone()
    }

    /// Reads the worker's busy slots at each scrape.
    pub(crate) fn watch_slots(&self, slots: Arc<std::sync::atomic::AtomicUsize>) {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).slots = Some(slots);
    }

    /// Counts the status watcher's queries (all of them, from its start) at each scrape.
    pub(crate) fn watch_watcher(&self, watcher: runwarden_runtime::StatusWatcher) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .watcher = Some((watcher, 0));
    }

    /// Brings the gauges and counters read from other parts up to date.
    fn refresh(&self) {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slots) = &sources.slots {
            let busy = slots.load(std::sync::atomic::Ordering::SeqCst);
            self.slots_busy.set(i64::try_from(busy).unwrap_or(i64::MAX));
        }
        if let Some((watcher, counted)) = &mut sources.watcher {
            let now = watcher.queries();
            self.watcher_queries.inc_by(now.saturating_sub(*counted));
            *counted = now;
        }
        for ((fault, seen), counted) in runwarden_base::store_errors_seen()
            .into_iter()
            .zip(sources.store_errors.iter_mut())
        {
            self.store_errors
                .get_or_create(&KindLabels {
                    kind: fault.as_str(),
                })
                .inc_by(seen.saturating_sub(*counted));
            *counted = seen;
        }
        for (state, seen) in runwarden_runtime::store_state_changes() {
            let states = &mut sources.store_states;
            let at = match states.iter().position(|(s, _)| *s == state) {
                Some(at) => at,
                None => {
                    states.push((state, 0));
                    states.len() - 1
                }
            };
            let counted = &mut states[at].1;
            self.store_state_changes
                .get_or_create(&KindLabels { kind: state })
                .inc_by(seen.saturating_sub(*counted));
            *counted = seen;
        }
    }

    /// Records one cancel latency.
    pub(crate) fn observe_cancel(&self, latency: Duration) {
        self.cancel_latency.observe(latency.as_secs_f64());
    }

    /// Records one API request.
    pub(crate) fn observe_request(&self, route: &str, method: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                method: method.to_string(),
                status,
            })
            .inc();
        self.request_seconds
            .get_or_create(&RouteLabels {
                route: route.to_string(),
                method: method.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// The executor's hook feeding the cancel histogram.
    pub(crate) fn observer(self: &Arc<Self>) -> CancelLatencyObserver {
        let metrics = self.clone();
        Arc::new(move |latency| metrics.observe_cancel(latency))
    }

    /// The exposition, with the database figures given.
    pub(crate) fn render(&self, runs: &[(RunState, u64)], calls: &[(String, u64)]) -> String {
        self.refresh();
        // Every status, so the gauge has a series for each even when no run is in it.
        for status in RunState::ALL {
            let n = runs
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, n)| *n);
            self.db_runs
                .get_or_create(&StatusLabels {
                    status: status.as_str().to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
            if status == RunState::WaitingForApproval {
                // R12: a waiting run waits on exactly one pending decision.
                self.db_decisions_pending
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        for (action, n) in calls {
            self.db_audit
                .get_or_create(&ActionLabels {
                    action: action.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        // Writing into a String cannot fail; an empty answer beats a panic.
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

/// R14: waits for limits as this process's calls meet them.
impl LimitObserver for Metrics {
    fn wait_began(&self) {
        self.limit_waiting.inc();
    }

    fn wait_ended(&self, end: WaitEnd, _waited: Duration) {
        self.limit_waiting.dec();
        self.limit_waits
            .get_or_create(&WaitLabels {
                outcome: end.as_str(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_status_each_action_requests_and_cumulative_buckets() {
        let metrics = Arc::new(Metrics::new());
        metrics.observe_cancel(Duration::from_micros(400));
        metrics.observe_cancel(Duration::from_millis(30));
        metrics.observe_cancel(Duration::from_secs(5));
        metrics.observe_request("/v1/runs/{id}", "GET", 200, Duration::from_millis(3));
        metrics.observe_request("/v1/runs/{id}", "GET", 200, Duration::from_millis(4));
        metrics.observe_request("/v1/runs/{id}", "GET", 404, Duration::from_millis(1));
        let calls = metrics.call_observer();
        calls("http_call", runwarden_vault::Delivery::Answered);
        calls(
            "http_call_cancelled",
            runwarden_vault::Delivery::MaybeDelivered,
        );
        calls("http_call", runwarden_vault::Delivery::Answered);
        let slots = Arc::new(std::sync::atomic::AtomicUsize::new(3));
        metrics.watch_slots(slots);
        let limits = metrics.limit_observer();
        limits.wait_began();
        limits.wait_began();
        limits.wait_ended(WaitEnd::TimedOut, Duration::from_secs(30));
        let _full = runwarden_base::StoreError::with_fault(
            "appending an audit row",
            runwarden_base::StoreFault::DiskFull,
            "disk full",
        );
        let text = metrics.render(
            &[(RunState::Running, 2), (RunState::WaitingForApproval, 4)],
            &[("http_call".into(), 7)],
        );
        for line in [
            "runwarden_db_runs{status=\"running\"} 2",
            "runwarden_db_runs{status=\"queued\"} 0",
            "runwarden_db_audit_rows{action=\"http_call\"} 7",
            "runwarden_http_requests_total{route=\"/v1/runs/{id}\",method=\"GET\",status=\"200\"} 2",
            "runwarden_http_requests_total{route=\"/v1/runs/{id}\",method=\"GET\",status=\"404\"} 1",
            "runwarden_http_request_duration_seconds_count{route=\"/v1/runs/{id}\",method=\"GET\"} 3",
            "runwarden_cancel_latency_seconds_bucket{le=\"0.001\"} 1",
            "runwarden_cancel_latency_seconds_bucket{le=\"0.025\"} 1",
            "runwarden_cancel_latency_seconds_bucket{le=\"0.05\"} 2",
            "runwarden_cancel_latency_seconds_bucket{le=\"2.5\"} 2",
            "runwarden_cancel_latency_seconds_bucket{le=\"1.0\"} 2",
            "runwarden_cancel_latency_seconds_bucket{le=\"+Inf\"} 3",
            "runwarden_cancel_latency_seconds_count 3",
            "runwarden_outbound_calls_total{action=\"http_call\",delivery=\"answered\"} 2",
            "runwarden_outbound_calls_total{action=\"http_call_cancelled\",delivery=\"maybe_delivered\"} 1",
            "runwarden_worker_slots_busy 3",
            "runwarden_db_decisions_pending 4",
            "runwarden_limit_waiting_calls 1",
            "runwarden_limit_waits_total{outcome=\"timed_out\"} 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Counted per process: other tests of this binary may add to it, never take away.
        let disk_full = text
            .lines()
            .find_map(|l| l.strip_prefix("runwarden_store_errors_total{kind=\"disk_full\"} "))
            .and_then(|n| n.parse::<u64>().ok());
        assert!(disk_full >= Some(1), "{text}");
        // Every kind has its series, even one this test never met (another test of this
        // binary may have made a `corrupt` error: the count is not asserted).
        assert!(
            text.lines()
                .any(|l| l.starts_with("runwarden_store_errors_total{kind=\"corrupt\"} ")),
            "{text}"
        );
    }
}
