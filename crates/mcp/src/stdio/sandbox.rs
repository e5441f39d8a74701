//! TEMPORARY stub of the sandbox (replaced by the sandbox branch): a plain child process.
#![allow(dead_code)]

use std::fmt;

use super::config::{ChildLimits, SandboxMode};

pub(crate) struct SpawnPlan<'a> {
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: Vec<(String, String)>,
    pub(crate) cwd: Option<&'a std::path::Path>,
    pub(crate) sandbox: SandboxMode,
    pub(crate) limits: ChildLimits,
    pub(crate) proxy_port: u16,
}

pub(crate) struct Spawned {
    pub(crate) pid: i32,
    pub(crate) stdin: tokio::process::ChildStdin,
    pub(crate) stdout: tokio::process::ChildStdout,
    pub(crate) stderr: tokio::process::ChildStderr,
    pub(crate) listener: Option<tokio::net::TcpListener>,
    pub(crate) exited: tokio::sync::oneshot::Receiver<ExitReason>,
}

#[derive(Debug, Clone)]
pub(crate) enum ExitReason {
    Status(i32),
    Signal(i32),
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(code) => write!(f, "exited with status {code}"),
            Self::Signal(signal) => write!(f, "killed by signal {signal}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SandboxError {
    #[error("could not start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
}

#[derive(Clone, Copy)]
pub(crate) enum Signal {
    Term,
    Kill,
}

pub(crate) async fn spawn(plan: SpawnPlan<'_>) -> Result<Spawned, SandboxError> {
    use std::os::unix::process::ExitStatusExt;
    let mut command = tokio::process::Command::new(plan.program);
    command
        .args(plan.args)
        .env_clear()
        .envs(plan.env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    if let Some(cwd) = plan.cwd {
        command.current_dir(cwd);
    }
    let mut child = command.spawn().map_err(|source| SandboxError::Spawn {
        program: plan.program.to_string(),
        source,
    })?;
    let pid = child.id().unwrap_or(0) as i32;
    let (stdin, stdout, stderr) = (
        child.stdin.take().unwrap(),
        child.stdout.take().unwrap(),
        child.stderr.take().unwrap(),
    );
    let (tx, exited) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let reason = match child.wait().await {
            Ok(status) => match status.code() {
                Some(code) => ExitReason::Status(code),
                None => ExitReason::Signal(status.signal().unwrap_or(0)),
            },
            Err(_) => ExitReason::Status(-1),
        };
        let _ = tx.send(reason);
    });
    Ok(Spawned {
        pid,
        stdin,
        stdout,
        stderr,
        listener: None,
        exited,
    })
}

pub(crate) fn kill_group(pid: i32, signal: Signal) {
    let signal = match signal {
        Signal::Term => "-TERM",
        Signal::Kill => "-KILL",
    };
    let _ = std::process::Command::new("kill")
        .args([signal, "--", &format!("-{pid}")])
        .status();
}

pub(crate) fn group_rss_bytes(_pid: i32) -> u64 {
    0
}
