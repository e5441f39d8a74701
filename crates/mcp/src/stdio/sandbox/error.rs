//! Why a local server's process could not be started, and what the operator can do.
//! No text here carries the server's environment: it may hold secrets.

use std::io;

use super::sys::{Failure, Step};

/// Why a local server's process could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SandboxError {
    /// The kernel refused a step of making the server's network namespace.
    #[error(
        "the kernel refused a network namespace ({}: {}): allow unprivileged user \
         namespaces (sysctl kernel.unprivileged_userns_clone=1 or \
         user.max_user_namespaces > 0), or set sandbox = \"none\" for this server to run \
         it without one",
        step.as_str(),
        os_text(*errno)
    )]
    Namespace {
        /// The step that failed.
        step: Step,
        /// Its error number.
        errno: i32,
    },
    /// The egress proxy's listening socket could not be opened inside the namespace.
    #[error(
        "could not open the egress proxy's port 127.0.0.1:{port} inside the sandbox \
         ({}: {}); this is a fault of runwarden's sandbox, please report it",
        step.as_str(),
        os_text(*errno)
    )]
    ProxyPort {
        /// The port asked for.
        port: u16,
        /// The step that failed.
        step: Step,
        /// Its error number.
        errno: i32,
    },
    /// A limit could not be set on the server's process.
    #[error(
        "could not limit the server's {what} to {value} ({}): set {key} at most to the \
         hard limit runwarden itself runs under ({command})",
        os_text(*errno)
    )]
    Limit {
        /// The limit in words.
        what: &'static str,
        /// Its configuration key.
        key: &'static str,
        /// The shell command that shows the hard limit.
        command: &'static str,
        /// The value asked for.
        value: u64,
        /// The error number.
        errno: i32,
    },
    /// The server's process could not be tied to runwarden's life.
    #[error(
        "could not make the server's process end with runwarden ({}: {})",
        step.as_str(),
        os_text(*errno)
    )]
    DeathSignal {
        /// The step that failed.
        step: Step,
        /// Its error number.
        errno: i32,
    },
    /// The program could not be started.
    #[error(
        "could not start {program}: {}; check the command and the PATH it is looked up in",
        os_text_of(source)
    )]
    Start {
        /// The program as configured.
        program: String,
        /// What exec said.
        source: io::Error,
    },
    /// The working directory cannot be read.
    #[error("could not enter the server's working directory {}: {}; check cwd", path.display(), os_text_of(source))]
    Directory {
        /// The directory as configured.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        source: io::Error,
    },
    /// The system refused a resource runwarden needs to start any server.
    #[error("could not start a local server: {what}: {}", os_text_of(source))]
    System {
        /// What was being made.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The thread that starts every local server has stopped (it never should).
    #[error("the thread that starts local servers has stopped; restart runwarden")]
    SpawnerStopped,
}

impl SandboxError {
    /// The error of a step the child reported, when the server was started with a proxy
    /// port and limits of `port`, `open_files` and `cpu_seconds`.
    pub(super) fn from_step(
        (step, errno): Failure,
        port: u16,
        open_files: u64,
        cpu_seconds: Option<u64>,
    ) -> Self {
        match step {
            Step::Listen | Step::HandOver => Self::ProxyPort { port, step, errno },
            Step::OpenFiles => Self::Limit {
                what: "open files",
                key: "open_files",
                command: "ulimit -Hn",
                value: open_files,
                errno,
            },
            Step::CpuTime => Self::Limit {
                what: "CPU time in seconds",
                key: "cpu_seconds",
                command: "ulimit -Ht",
                value: cpu_seconds.unwrap_or(0),
                errno,
            },
            Step::DeathSignal | Step::Fork => Self::DeathSignal { step, errno },
            Step::Unshare
            | Step::Dumpable
            | Step::Setgroups
            | Step::UidMap
            | Step::GidMap
            | Step::Loopback => Self::Namespace { step, errno },
        }
    }
}

/// The system's words for an error number, without Rust's "(os error N)".
fn os_text(errno: i32) -> String {
    os_text_of(&io::Error::from_raw_os_error(errno))
}

fn os_text_of(error: &io::Error) -> String {
    let text = error.to_string();
    match (error.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(at)) => text[..at].to_owned(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_namespace_says_what_failed_and_the_two_ways_out() {
        let error = SandboxError::from_step((Step::Unshare, libc::EPERM), 9000, 1024, None);
        assert_eq!(
            error.to_string(),
            "the kernel refused a network namespace (unshare: Operation not permitted): \
             allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 \
             or user.max_user_namespaces > 0), or set sandbox = \"none\" for this server \
             to run it without one"
        );
    }

    #[test]
    fn a_limit_the_host_refuses_names_the_key_to_lower() {
        let error = SandboxError::from_step((Step::OpenFiles, libc::EPERM), 0, 1 << 40, None);
        assert_eq!(
            error.to_string(),
            "could not limit the server's open files to 1099511627776 (Operation not \
             permitted): set open_files at most to the hard limit runwarden itself runs \
             under (ulimit -Hn)"
        );
        let error = SandboxError::from_step((Step::CpuTime, libc::EPERM), 0, 64, Some(30));
        assert!(
            error.to_string().contains("CPU time in seconds to 30"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_program_is_named_without_rusts_error_number() {
        let error = SandboxError::Start {
            program: "mcp-server-git".into(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(
            error.to_string(),
            "could not start mcp-server-git: No such file or directory; check the command \
             and the PATH it is looked up in"
        );
    }
}
