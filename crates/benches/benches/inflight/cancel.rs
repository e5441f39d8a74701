//! The inflight bench's cancel trials: 10,000 in-flight calls cancelled at once, through
//! the watcher (woken by the hub, the change feed or nothing), the vault's own flag and
//! bare reqwest; each with the CPU time this process and the server spent until the last
//! close. `-- cancel` runs the hub's, the flag's and bare reqwest's alone, in rounds.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use runwarden_benches::{cpu_time, cpu_time_of};
use runwarden_runtime::{Change, ChangeFeed, RunState, RunStore};
use runwarden_testkit::Dist;
use runwarden_vault::CancelFlag;
use tokio::task::JoinSet;

use super::{
    CANCEL_CALLS, Ctx, Design, SETTLE, StallServer, bare_calls, ms, start_calls, wall_nanos,
};

pub(crate) struct CancelFigure {
    variant: &'static str,
    calls: usize,
    closes: Dist,
    missing: usize,
    cpu: CpuWindow,
}

impl CancelFigure {
    pub(crate) fn new(variant: &'static str, closes: Vec<Duration>, cpu: CpuWindow) -> Self {
        Self {
            variant,
            calls: CANCEL_CALLS,
            missing: CANCEL_CALLS - closes.len(),
            closes: Dist::new(closes),
            cpu,
        }
    }
}

/// CPU time spent during a cancel trial: by this process and by the server's from the
/// cancel to the last close, and by this process until every call had ended.
pub(crate) struct CpuWindow {
    client: Duration,
    server: Duration,
    client_to_end: Duration,
}

/// The CPU clocks at a trial's cancel.
pub(crate) struct CpuMark {
    client: Duration,
    server: Duration,
    server_pid: u32,
}

/// What each side spent from the mark to the last close.
pub(crate) struct AtClose {
    mark: CpuMark,
    client: Duration,
    server: Duration,
}

impl CpuMark {
    pub(crate) fn now(server: &StallServer) -> Self {
        let server_pid = server.child.id();
        Self {
            client: cpu_time(),
            server: cpu_time_of(Some(server_pid), false),
            server_pid,
        }
    }

    /// At the last close.
    pub(crate) fn closed(self) -> AtClose {
        let client = cpu_time().saturating_sub(self.client);
        let server = cpu_time_of(Some(self.server_pid), false).saturating_sub(self.server);
        AtClose {
            mark: self,
            client,
            server,
        }
    }
}

impl AtClose {
    /// Once every call of the trial has ended.
    pub(crate) fn ended(self) -> CpuWindow {
        CpuWindow {
            client: self.client,
            server: self.server,
            client_to_end: cpu_time().saturating_sub(self.mark.client),
        }
    }
}

/// `-- cancel`: the cancel trials alone, `BENCH_CANCEL_ROUNDS` rounds (default 3).
pub(crate) fn cancel_only(json: bool) {
    let rounds = std::env::var("BENCH_CANCEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_usize)
        .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the client runtime starts");
    let started = Instant::now();
    let rounds = runtime.block_on(cancel_rounds(rounds));
    let mut ratios = Vec::new();
    for (i, round) in rounds.iter().enumerate() {
        println!();
        println!("Round {} of {}", i + 1, rounds.len());
        print_cancels(round);
        ratios.push(p99_ratio(round, "watcher, woken"));
    }
    ratios.sort_by(f64::total_cmp);
    let mid = ratios.len() / 2;
    let median = if ratios.len() % 2 == 0 {
        (ratios[mid - 1] + ratios[mid]) / 2.0
    } else {
        ratios[mid]
    };
    println!();
    println!(
        "hub / bare p99, each round: {}; median x{median:.2}",
        ratios
            .iter()
            .map(|r| format!("x{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    println!("(took {:.1} s)", started.elapsed().as_secs_f64());
    if json {
        for (i, round) in rounds.iter().enumerate() {
            for figure in round {
                println!("{}", cancel_json(figure, Some(i + 1)));
            }
        }
    }
}

/// The hub's, the flag's and bare reqwest's trials, `rounds` times, taking turns, so each
/// round's ratio compares trials a few seconds apart.
async fn cancel_rounds(rounds: usize) -> Vec<Vec<CancelFigure>> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ctx = Ctx::open(dir.path()).await;
    let mut server = StallServer::start();
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let variant = "watcher, woken through the hub";
        let hub = watcher_cancel(&ctx, &mut server, variant, Wake::Hub).await;
        let flag = flag_cancel(&ctx, &mut server).await;
        let bare = bare_cancel(&mut server).await;
        out.push(vec![hub, flag, bare]);
    }
    out
}

/// A variant's p99 over bare reqwest's in the same round.
fn p99_ratio(round: &[CancelFigure], variant: &str) -> f64 {
    let p99 = |prefix: &str| {
        round
            .iter()
            .find(|f| f.variant.starts_with(prefix))
            .map_or(f64::NAN, |f| f.closes.pct(99.0).as_secs_f64())
    };
    p99(variant) / p99("bare")
}

pub(crate) fn cancel_json(figure: &CancelFigure, round: Option<usize>) -> serde_json::Value {
    serde_json::json!({"bench": "inflight_cancel", "variant": figure.variant, "calls": figure.calls,
        "round": round, "closes": figure.closes.len(), "p50_ms": ms(figure.closes.pct(50.0)),
        "p99_ms": ms(figure.closes.pct(99.0)), "max_ms": ms(figure.closes.max()),
        "cpu_ms": ms(figure.cpu.client), "server_cpu_ms": ms(figure.cpu.server),
        "cpu_to_end_ms": ms(figure.cpu.client_to_end)})
}

/// How a watcher trial's cancel reaches the calls.
#[derive(Clone, Copy)]
pub(crate) enum Wake {
    /// `CancelHub::wake` per run, as `Executor::cancel` does.
    Hub,
    /// One change per run on the store's feed, as another node's NOTIFY.
    Feed,
    /// Nothing: the watcher's periodic refresh finds it.
    Nothing,
}

/// `CANCEL_CALLS` guarded calls through the watcher, cancelled in one committed UPDATE.
pub(crate) async fn watcher_cancel(
    ctx: &Ctx,
    server: &mut StallServer,
    variant: &'static str,
    wake: Wake,
) -> CancelFigure {
    ctx.reset();
    let unused = Arc::new(AtomicU64::new(0));
    let url = server.url.clone();
    let calls = start_calls(ctx, &url, CANCEL_CALLS, Design::Watcher, &unused).await;
    let start = || ctx.cancel_all();
    let cancel = |_: &mut JoinSet<()>| match wake {
        Wake::Hub => ctx.runs.iter().for_each(|id| ctx.hub.wake(id)),
        Wake::Feed => announce(ctx.store.change_feed(), &ctx.runs),
        Wake::Nothing => {}
    };
    trial(server, calls, variant, start, cancel).await
}

/// Baseline: the vault's own in-memory flag, woken; no store involved.
pub(crate) async fn flag_cancel(ctx: &Ctx, server: &mut StallServer) -> CancelFigure {
    let flags: Vec<CancelFlag> = (0..CANCEL_CALLS).map(|_| CancelFlag::new()).collect();
    let mut calls = JoinSet::new();
    for flag in &flags {
        let (egress, request, flag) = (ctx.egress.clone(), ctx.request(&server.url), flag.clone());
        calls.spawn(async move {
            let _ = egress.send(request, Some(&flag)).await;
        });
    }
    let cancel = |_: &mut JoinSet<()>| flags.iter().for_each(CancelFlag::cancel);
    let variant = "vault CancelFlag, woken (no store)";
    trial(server, calls, variant, wall_nanos, cancel).await
}

/// Baseline: bare reqwest POSTs, their futures dropped at once.
pub(crate) async fn bare_cancel(server: &mut StallServer) -> CancelFigure {
    let bare = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a bare reqwest client");
    let calls = bare_calls(&bare, &server.url, CANCEL_CALLS);
    let variant = "bare reqwest, futures dropped";
    trial(server, calls, variant, wall_nanos, JoinSet::abort_all).await
}

/// One trial: once the server holds every call and a settling second has passed, `start`
/// answers t0 (the cancel's commit, or now) and `cancel` reaches the calls; then the closes
/// after t0, and the CPU spent until the last close and until every call ended.
async fn trial(
    server: &mut StallServer,
    mut calls: JoinSet<()>,
    variant: &'static str,
    start: impl FnOnce() -> i128,
    cancel: impl FnOnce(&mut JoinSet<()>),
) -> CancelFigure {
    server
        .requests(CANCEL_CALLS, Duration::from_secs(120))
        .await;
    tokio::time::sleep(SETTLE).await;
    let t0 = start();
    let mark = CpuMark::now(server);
    cancel(&mut calls);
    let closes = server
        .closes(CANCEL_CALLS, t0, Duration::from_secs(60))
        .await;
    let closed = mark.closed();
    while calls.join_next().await.is_some() {}
    CancelFigure::new(variant, closes, closed.ended())
}

/// One `Change::Status { Cancelled }` per run, as the NOTIFYs of a cancel on another node.
pub(crate) fn announce(feed: &ChangeFeed, runs: &[String]) {
    for id in runs {
        feed.publish(Change::Status {
            run_id: id.clone(),
            status: RunState::Cancelled,
        });
    }
}

pub(crate) fn print_cancels(figures: &[CancelFigure]) {
    println!();
    println!(
        "{CANCEL_CALLS} in-flight calls cancelled at once: row committed (or flags flipped, futures dropped) -> close seen by the server"
    );
    println!(
        "CPU ms: this process and the server, from the cancel to the last close; \"to end\": this process until every call ended"
    );
    println!(
        "{:<46} {:>7} {:>8} {:>8} {:>8} {:>7} {:>6} {:>6} {:>6}",
        "variant", "closes", "p50 ms", "p99 ms", "max ms", "missing", "CPU", "server", "to end"
    );
    let bare = figures
        .iter()
        .find(|f| f.variant.starts_with("bare"))
        .map(|f| f.closes.pct(99.0));
    for f in figures {
        let ratio = bare
            .filter(|b| !b.is_zero())
            .map(|b| {
                let r = f.closes.pct(99.0).as_secs_f64() / b.as_secs_f64();
                format!("  p99 x{r:.2} of bare")
            })
            .unwrap_or_default();
        println!(
            "{:<46} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>6.0} {:>6.0} {:>6.0}{ratio}",
            f.variant,
            f.closes.len(),
            ms(f.closes.pct(50.0)),
            ms(f.closes.pct(99.0)),
            ms(f.closes.max()),
            f.missing,
            ms(f.cpu.client),
            ms(f.cpu.server),
            ms(f.cpu.client_to_end),
        );
    }
}
