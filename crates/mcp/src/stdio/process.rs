//! A local server's process: started on first use (with backoff after it died young),
//! watched (its exit, its memory), given up on after a cancelled call that it does not
//! end within the grace, and stopped politely (stdin closed, then SIGTERM, then SIGKILL
//! of its process group).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runwarden_vault::{CancelFlag, EgressClient, EnvironmentFor, ProxyLabel, Redactor};
use tokio::sync::watch;

use super::config::{EnvValue, SandboxMode, StdioConfig};
use super::link::Link;
use super::sandbox::{self, Signal, SpawnPlan};

/// Where the egress proxy listens inside a sandboxed server's own network namespace.
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// How often a server's memory is looked at.
const MEMORY_TICK: Duration = Duration::from_millis(200);

/// A process that lives less than this counts as dying young: the next start waits.
const YOUNG: Duration = Duration::from_secs(5);

/// The longest wait before a start after the server kept dying young.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The variables a sandboxed server gets so that HTTP clients use the proxy.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// One running process of a local server.
pub(crate) struct Process {
    pub(crate) generation: u64,
    pub(crate) link: Arc<Link>,
    pid: i32,
    started: Instant,
    /// Set once the process is gone: why, in words a person reads.
    exit: watch::Receiver<Option<String>>,
    /// Why we stopped it, when we did (its memory, a call it would not end).
    stopped_because: Arc<Mutex<Option<String>>>,
    /// No new call goes to it; it is stopped once its calls are done.
    retired: AtomicBool,
    in_flight: AtomicUsize,
    idle: tokio::sync::Notify,
    /// Ends the proxy and the memory watch with the process.
    done: Done,
}

/// Counts a call in flight on a process while it lives.
pub(crate) struct InFlight(Arc<Process>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Process {
    /// True while the process runs and takes calls.
    pub(crate) fn usable(&self) -> bool {
        self.exit.borrow().is_none() && !self.retired.load(Ordering::Acquire)
    }

    /// Why the process ended, once it did.
    pub(crate) fn exit(&self) -> watch::Receiver<Option<String>> {
        self.exit.clone()
    }

    /// Counts a call in flight until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// A call was given up on after it may have reached the server (cancelled, out of
    /// time): the server gets `grace` to end it (an answer to `id`, as a cooperative
    /// server sends after `notifications/cancelled`). Otherwise its handler may still be
    /// acting, so the process takes no new call and its process group is killed once
    /// its other calls are done.
    pub(crate) fn abandoned(self: &Arc<Self>, id: i64, grace: Duration) {
        let answered = self.link.answered_late(id);
        let process = self.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(grace, answered).await {
                // It answered (the call ended), or its stdout closed (it is ending).
                Ok(_) => return,
                Err(_) if process.exit.borrow().is_some() => return,
                Err(_) => {}
            }
            process.retired.store(true, Ordering::Release);
            loop {
                let idle = process.idle.notified();
                if process.in_flight.load(Ordering::Acquire) == 0 {
                    break;
                }
                idle.await;
            }
            let reason = format!(
                "it did not end a cancelled call within its {} ms grace",
                grace.as_millis()
            );
            tracing::warn!(pid = process.pid, "stopping a local server: {reason}");
            process.kill(reason);
        });
    }

    /// Kills the process group at once, remembering why.
    fn kill(&self, reason: String) {
        if self.exit.borrow().is_some() {
            return;
        }
        self.stopped_because
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason);
        sandbox::kill_group(self.pid, Signal::Kill);
    }

    /// Stops the process: stdin closed, then SIGTERM, then SIGKILL of its group, each
    /// after `grace` without an exit.
    pub(crate) async fn stop(&self, grace: Duration) {
        self.retired.store(true, Ordering::Release);
        let mut exit = self.exit.clone();
        self.link.close_stdin().await;
        for signal in [None, Some(Signal::Term), Some(Signal::Kill)] {
            if let Some(signal) = signal {
                sandbox::kill_group(self.pid, signal);
            }
            let gone = tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await;
            if gone.is_ok() {
                break;
            }
        }
        // Whatever the leader did, nothing of its group outlives it. Once it is reaped its
        // pid may be another process's, so a group that has ended gets no signal.
        if self.exit.borrow().is_none() {
            sandbox::kill_group(self.pid, Signal::Kill);
        }
        self.done.set();
    }
}

/// A local server: the process that serves it now, started on first use.
pub(crate) struct LocalServer {
    name: String,
    config: StdioConfig,
    egress: Arc<EgressClient>,
    max_line: usize,
    current: Mutex<Option<Arc<Process>>>,
    starting: tokio::sync::Mutex<Backoff>,
    generations: AtomicU64,
}

#[derive(Default)]
struct Backoff {
    young_deaths: u32,
}

impl LocalServer {
    pub(crate) fn new(
        name: &str,
        config: StdioConfig,
        egress: Arc<EgressClient>,
        max_line: usize,
    ) -> Self {
        Self {
            name: name.to_string(),
            config,
            egress,
            max_line,
            current: Mutex::default(),
            starting: tokio::sync::Mutex::default(),
            generations: AtomicU64::new(0),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Process>>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process of generation `generation`, while it takes calls.
    pub(crate) fn current(&self, generation: u64) -> Option<Arc<Process>> {
        self.slot()
            .as_ref()
            .filter(|p| p.generation == generation && p.usable())
            .cloned()
    }

    /// The generation of the process that takes calls now, 0 when none does.
    pub(crate) fn generation(&self) -> u64 {
        self.slot()
            .as_ref()
            .filter(|p| p.usable())
            .map_or(0, |p| p.generation)
    }

    /// Why the last process ended, when it did.
    pub(crate) fn last_exit(&self) -> Option<String> {
        self.slot().as_ref().and_then(|p| p.exit.borrow().clone())
    }

    /// A new process for a new session: any old one is stopped, and a server that kept
    /// dying young waits (100 ms, doubling, at most 5 s, never past `budget`) first.
    pub(crate) async fn fresh(&self, budget: Duration) -> Result<Arc<Process>, String> {
        let mut backoff = self.starting.lock().await;
        let old = self.slot().take();
        if let Some(old) = old {
            let young = old.started.elapsed() < YOUNG && old.exit.borrow().is_some();
            backoff.young_deaths = if young { backoff.young_deaths + 1 } else { 0 };
            // A process given up after an ignored cancel finishes its other calls first;
            // its watch kills it once they are done.
            if old.in_flight.load(Ordering::Acquire) == 0 {
                old.stop(self.config.cancel_grace).await;
            }
        }
        if backoff.young_deaths > 0 {
            let wait = Duration::from_millis(100) * 2u32.saturating_pow(backoff.young_deaths - 1);
            let wait = wait.min(MAX_BACKOFF);
            if wait >= budget {
                return Err(format!(
                    "it exited soon after each of its last {} starts; the next start waits {} ms, longer than the call's budget",
                    backoff.young_deaths,
                    wait.as_millis()
                ));
            }
            tokio::time::sleep(wait).await;
        }
        let process = Arc::new(self.spawn().await?);
        *self.slot() = Some(process.clone());
        Ok(process)
    }

    /// Stops the process, if one runs.
    pub(crate) async fn stop(&self) {
        let process = self.slot().take();
        if let Some(process) = process {
            process.stop(self.config.cancel_grace).await;
        }
    }

    async fn spawn(&self) -> Result<Process, String> {
        let env = self.environment().await?;
        let plan = SpawnPlan {
            program: &self.config.command,
            args: &self.config.args,
            env,
            cwd: self.config.cwd.as_deref(),
            sandbox: self.config.sandbox,
            limits: self.config.limits,
            proxy_port: EGRESS_PROXY_PORT,
        };
        let spawned = sandbox::spawn(plan).await.map_err(|e| e.to_string())?;
        let redactor = self.egress.redactor().await.unwrap_or_else(|error| {
            tracing::warn!(server = %self.name, %error, "could not load the secrets to scrub the server's output with");
            Redactor::none()
        });
        let link = Link::start(
            &self.name,
            Box::new(spawned.stdin),
            Box::new(spawned.stdout),
            Box::new(spawned.stderr),
            self.max_line,
            redactor,
        );
        let done = Done::default();
        let stopped_because = Arc::new(Mutex::new(None));
        let (exit_tx, exit) = watch::channel(None);
        let because = stopped_because.clone();
        let (server, pid) = (self.name.clone(), spawned.pid);
        let exited = spawned.exited;
        let watch_done = done.clone();
        tokio::spawn(async move {
            let how = match exited.await {
                Ok(how) => how.to_string(),
                Err(_) => "it ended in a way that could not be read".to_string(),
            };
            let reason = match because.lock().unwrap_or_else(|p| p.into_inner()).take() {
                Some(because) => format!("stopped by runwarden: {because} ({how})"),
                None => how,
            };
            tracing::info!(server = %server, pid, "the local server's process ended: {reason}");
            exit_tx.send_replace(Some(reason));
            watch_done.set();
        });
        let generation = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let process = Process {
            generation,
            link,
            pid,
            started: Instant::now(),
            exit,
            stopped_because,
            retired: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
            done,
        };
        self.watch_memory(&process);
        if let Some(listener) = spawned.listener {
            self.serve_proxy(listener, &process);
        }
        Ok(process)
    }

    /// The server's whole environment: `PATH` (unless the configuration sets it), the
    /// configured variables with secrets read from the vault, and in a sandbox the proxy.
    async fn environment(&self) -> Result<Vec<(String, String)>, String> {
        let mut env = Vec::new();
        if !self.config.env.contains_key("PATH")
            && let Ok(path) = std::env::var("PATH")
        {
            env.push(("PATH".to_string(), path));
        }
        let mut secrets = Vec::new();
        for (name, value) in &self.config.env {
            match value {
                EnvValue::Literal(text) => env.push((name.clone(), text.clone())),
                EnvValue::Secret(secret) => secrets.push((name.clone(), secret.clone())),
            }
        }
        let asking = EnvironmentFor {
            actor: "mcp".into(),
            target: format!("stdio:{}", self.name),
            reason: format!("start local server {}", self.name),
        };
        let values = self
            .egress
            .environment(&secrets, &asking)
            .await
            .map_err(|e| format!("could not read the secrets of its environment: {e}"))?;
        for (name, value) in values {
            let text = String::from_utf8(value.expose().to_vec()).map_err(|_| {
                format!("the secret for {name} is not UTF-8 text, so it cannot be an environment variable")
            })?;
            env.push((name, text));
        }
        if self.config.sandbox == SandboxMode::Namespace {
            let proxy = format!("http://127.0.0.1:{EGRESS_PROXY_PORT}");
            env.retain(|(name, _)| !PROXY_VARIABLES.contains(&name.as_str()));
            env.extend(PROXY_VARIABLES.map(|name| (name.to_string(), proxy.clone())));
        }
        Ok(env)
    }

    /// Stops the process group when it uses more memory than its limit.
    fn watch_memory(&self, process: &Process) {
        let limit = self.config.limits.memory_mb * 1024 * 1024;
        let sandboxed = self.config.sandbox == SandboxMode::Namespace;
        let (pid, done, because) = (
            process.pid,
            process.done.clone(),
            process.stopped_because.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(MEMORY_TICK);
            loop {
                tokio::select! {
                    () = done.wait() => return,
                    _ = tick.tick() => {}
                }
                let used = sandbox::group_rss_bytes(pid, sandboxed);
                if used > limit {
                    because
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(format!(
                            "it used {} MiB, over its memory limit of {} MiB (memory_mb)",
                            used / (1024 * 1024),
                            limit / (1024 * 1024)
                        ));
                    sandbox::kill_group(pid, Signal::Kill);
                    return;
                }
            }
        });
    }

    /// Serves the vault's egress proxy on the sandbox's listener until the process ends.
    fn serve_proxy(&self, listener: tokio::net::TcpListener, process: &Process) {
        let label = ProxyLabel {
            actor: format!("mcp:{}", self.name),
            reason: format!("sandbox egress of mcp server {}", self.name),
        };
        let stop = Arc::new(CancelFlag::new());
        let (done, flag) = (process.done.clone(), stop.clone());
        tokio::spawn(async move {
            done.wait().await;
            flag.cancel();
        });
        tokio::spawn(self.egress.clone().serve_proxy(listener, label, stop));
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        // Nothing of a server outlives the client that started it (a reload that changed
        // it, the end of the process): it is stopped politely where a runtime can wait
        // for it, at once otherwise.
        let Some(process) = self.slot().take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let grace = self.config.cancel_grace;
                runtime.spawn(async move { process.stop(grace).await });
            }
            Err(_) => {
                if process.exit.borrow().is_none() {
                    sandbox::kill_group(process.pid, Signal::Kill);
                }
                process.done.set();
            }
        }
    }
}

/// Set once a process is gone; its proxy and its memory watch wait on it.
#[derive(Clone, Default)]
struct Done(Arc<watch::Sender<bool>>);

impl Done {
    fn set(&self) {
        self.0.send_replace(true);
    }

    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }
}
