//! How a local server's process ended, in words a person reads.

use std::time::Duration;

use super::sys::Ended;

/// How a local server's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExitReason {
    /// It exited by itself with this status.
    Exited(i32),
    /// A signal ended it (sent by runwarden, another process or the kernel).
    Signalled(i32),
    /// The kernel stopped it at its CPU time limit, of this many seconds.
    CpuLimit(u64),
    /// Its end could not be observed: it may still run. Says why.
    Unknown(String),
}

impl ExitReason {
    /// Names the end of a process with a CPU time limit of `cpu_seconds`, having used
    /// `cpu_used`. The kernel sends SIGXCPU at the limit and SIGKILL a second later (when
    /// the process handled or ignored SIGXCPU): either, with the time used past the limit,
    /// is the limit's doing.
    pub(super) fn from_wait(ended: Ended, cpu_used: Duration, cpu_seconds: Option<u64>) -> Self {
        match (ended, cpu_seconds) {
            (Ended::Exited(code), _) => Self::Exited(code),
            (Ended::Signalled(libc::SIGXCPU), Some(limit)) => Self::CpuLimit(limit),
            (Ended::Signalled(libc::SIGKILL), Some(limit))
                if cpu_used >= Duration::from_secs(limit) =>
            {
                Self::CpuLimit(limit)
            }
            (Ended::Signalled(signal), _) => Self::Signalled(signal),
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(code) => write!(f, "exited with status {code}"),
            Self::Signalled(signal) => match signal_name(*signal) {
                Some(name) => write!(f, "killed by signal {signal} ({name})"),
                None => write!(f, "killed by signal {signal}"),
            },
            Self::CpuLimit(1) => f.write_str("over its CPU time limit of 1 second"),
            Self::CpuLimit(seconds) => write!(f, "over its CPU time limit of {seconds} seconds"),
            Self::Unknown(why) => write!(f, "ended in a way runwarden could not see ({why})"),
        }
    }
}

/// The usual name of the signals a server is likely to die of.
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_reads_as_plain_words() {
        assert_eq!(ExitReason::Exited(3).to_string(), "exited with status 3");
        assert_eq!(
            ExitReason::Signalled(9).to_string(),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(ExitReason::Signalled(63).to_string(), "killed by signal 63");
        assert_eq!(
            ExitReason::CpuLimit(5).to_string(),
            "over its CPU time limit of 5 seconds"
        );
        assert_eq!(
            ExitReason::CpuLimit(1).to_string(),
            "over its CPU time limit of 1 second"
        );
    }

    #[test]
    fn sigxcpu_or_a_sigkill_past_the_cpu_limit_is_the_limit() {
        let used = |s| Duration::from_millis(s);
        let xcpu = Ended::Signalled(libc::SIGXCPU);
        let kill = Ended::Signalled(libc::SIGKILL);
        assert_eq!(
            ExitReason::from_wait(xcpu, used(1000), Some(1)),
            ExitReason::CpuLimit(1)
        );
        assert_eq!(
            ExitReason::from_wait(kill, used(2000), Some(1)),
            ExitReason::CpuLimit(1)
        );
        // A SIGKILL before the limit was reached is someone else's (a cancel, the memory
        // watch, an operator).
        assert_eq!(
            ExitReason::from_wait(kill, used(300), Some(1)),
            ExitReason::Signalled(9)
        );
        assert_eq!(
            ExitReason::from_wait(kill, used(9000), None),
            ExitReason::Signalled(9)
        );
        // Without a limit SIGXCPU is just a signal.
        assert_eq!(
            ExitReason::from_wait(xcpu, used(0), None),
            ExitReason::Signalled(24)
        );
        assert_eq!(
            ExitReason::from_wait(Ended::Exited(0), used(5000), Some(1)),
            ExitReason::Exited(0)
        );
    }
}
