//! Signal handlers installed synchronously, before a command starts work, so an early
//! Ctrl-C or SIGTERM is handled (cancel, drain) and never the default "die at once".

use runwarden_runtime::StopLevel;
use tokio::sync::watch;

#[cfg(unix)]
fn install(kind: tokio::signal::unix::SignalKind) -> Option<tokio::signal::unix::Signal> {
    // Creating the stream installs the handler now, not when it is first polled.
    tokio::signal::unix::signal(kind).ok()
}

/// Runs `action` on the first Ctrl-C (SIGINT).
pub(crate) fn on_interrupt(action: impl FnOnce() + Send + 'static) {
    #[cfg(unix)]
    {
        let mut interrupt = install(tokio::signal::unix::SignalKind::interrupt());
        tokio::spawn(async move {
            if let Some(interrupt) = interrupt.as_mut()
                && interrupt.recv().await.is_some()
            {
                action();
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            action();
        }
    });
}

/// Why a synchronous run's own process cancels it: the first of Ctrl-C, SIGTERM, SIGHUP or
/// a closed standard output. Later causes change nothing (the first one is reported).
#[derive(Default)]
pub(crate) struct Interrupt {
    notify: tokio::sync::Notify,
    cause: std::sync::OnceLock<&'static str>,
}

impl Interrupt {
    /// Records the cause (the first one wins) and wakes the waiter, now or when it waits.
    pub(crate) fn fire(&self, cause: &'static str) {
        if self.cause.set(cause).is_ok() {
            self.notify.notify_one();
        }
    }

    /// Waits for the first cause; one fired before the wait is kept as a permit.
    pub(crate) async fn fired(&self) -> &'static str {
        self.notify.notified().await;
        self.cause.get().copied().unwrap_or("a signal")
    }

    /// The cause, once fired.
    pub(crate) fn cause(&self) -> Option<&'static str> {
        self.cause.get().copied()
    }
}

/// Fires `interrupt` on Ctrl-C (SIGINT), SIGTERM and SIGHUP: a terminal closed, a
/// supervisor's stop and Ctrl-C all cancel a synchronous run through the operator's path,
/// instead of the default "die at once" that left the run to a later worker.
pub(crate) fn cancel_on_signals(interrupt: std::sync::Arc<Interrupt>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::SignalKind;
        for (kind, cause) in [
            (SignalKind::interrupt(), "Ctrl-C"),
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::hangup(), "SIGHUP"),
        ] {
            let Some(mut signal) = install(kind) else {
                continue;
            };
            let interrupt = interrupt.clone();
            tokio::spawn(async move {
                if signal.recv().await.is_some() {
                    interrupt.fire(cause);
                }
            });
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.fire("Ctrl-C");
        }
    });
}

/// Fires `interrupt` when the reader of standard output goes away (`run ... | head -1`),
/// even while nothing is being written (a tool call on the wire): the kernel reports an
/// error condition on a pipe or socket whose other end closed. Only pipes and sockets are
/// watched; a terminal or a file never closes under the process this way.
pub(crate) fn cancel_on_closed_stdout(interrupt: std::sync::Arc<Interrupt>) {
    #[cfg(unix)]
    {
        use rustix::event::{PollFd, PollFlags, poll};
        use rustix::fs::FileType;
        let stdout = std::io::stdout();
        let watched = rustix::fs::fstat(&stdout)
            .map(|stat| FileType::from_raw_mode(stat.st_mode))
            .is_ok_and(|kind| matches!(kind, FileType::Fifo | FileType::Socket));
        if !watched {
            return;
        }
        // A plain thread, not a blocking task: it never returns while the reader is there,
        // and the runtime must not wait for it at exit.
        let spawned = std::thread::Builder::new()
            .name("stdout-watch".into())
            .spawn(move || {
                let stdout = std::io::stdout();
                loop {
                    // No events asked: only POLLERR / POLLHUP (always reported) wake it.
                    let mut fds = [PollFd::new(&stdout, PollFlags::empty())];
                    match poll(&mut fds, None) {
                        Ok(_) if fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP) => {
                            interrupt.fire(super::run::CLOSED_STDOUT);
                            return;
                        }
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(_) => return,
                    }
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not watch standard output for its reader closing");
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt;
}

/// Two-step stop for long-running commands: the first SIGTERM or Ctrl-C asks to drain,
/// the second to stop at once.
pub(crate) fn stop_levels() -> watch::Receiver<StopLevel> {
    let (tx, rx) = watch::channel(StopLevel::Run);
    #[cfg(unix)]
    {
        let mut interrupt = install(tokio::signal::unix::SignalKind::interrupt());
        let mut terminate = install(tokio::signal::unix::SignalKind::terminate());
        tokio::spawn(async move {
            for level in [StopLevel::Drain, StopLevel::Now] {
                let int = async {
                    match interrupt.as_mut() {
                        Some(s) => drop(s.recv().await),
                        None => std::future::pending::<()>().await,
                    }
                };
                let term = async {
                    match terminate.as_mut() {
                        Some(s) => drop(s.recv().await),
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    () = int => {}
                    () = term => {}
                }
                announce(level);
                let _ = tx.send(level);
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        for level in [StopLevel::Drain, StopLevel::Now] {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
            announce(level);
            let _ = tx.send(level);
        }
    });
    rx
}

fn announce(level: StopLevel) {
    if level == StopLevel::Drain {
        eprintln!(
            "stopping: no new runs; running ones go back to the queue at their next step (again to exit now)"
        );
    }
}
