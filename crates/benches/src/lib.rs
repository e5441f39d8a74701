//! runwarden's benchmarks. Each is a harness-less binary under `benches/` (run one with
//! `cargo bench -p runwarden-benches --bench NAME`); `BENCHMARKS.md` holds their figures
//! and commands. They sit in this crate, above every other, so what they measure against
//! (the official MCP SDK's client, a second reqwest, PostgreSQL) stays out of the product
//! crates' dependencies. This library holds what several of them read off the process,
//! and the allocator: the `runwarden` binary's, so a bench that measures the product in its
//! own process measures it as shipped. Every bench links it (`use runwarden_benches as _;`
//! when it uses nothing else from here).

use std::time::Duration;

/// The `runwarden` binary's allocator (see the workspace's Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The kernel's clock ticks per second for `/proc` CPU times (`getconf CLK_TCK`, 100 on
/// Linux's common builds).
const TICKS_PER_SECOND: f64 = 100.0;

/// The process's CPU time so far (all threads, user and system), from `/proc/self/stat`,
/// to the kernel's tick (10 ms).
pub fn cpu_time() -> Duration {
    cpu_time_of(None, false)
}

/// The CPU time of process `pid` (this process for `None`), with, when `reaped` is true,
/// the time of the children it has waited for; zero when it cannot be read.
pub fn cpu_time_of(pid: Option<u32>, reaped: bool) -> Duration {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut total = ticks(11) + ticks(12);
    if reaped {
        total += ticks(13) + ticks(14);
    }
    Duration::from_secs_f64(total as f64 / TICKS_PER_SECOND)
}

/// The resident set of process `pid` (this process for `None`), in KiB, from the
/// `VmRSS` line of `/proc/PID/status`; 0 when it cannot be read.
pub fn rss_kib(pid: Option<u32>) -> u64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Raises this process's open-file limit to its hard cap, for benches that hold thousands
/// of connections (children inherit it).
pub fn raise_nofile() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if let Err(error) = setrlimit(Resource::Nofile, raised) {
        eprintln!("could not raise the open-file limit: {error}");
    }
}
