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
