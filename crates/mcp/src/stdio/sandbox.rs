//! The sandbox a local server runs in: how its process is started so that it is contained.
//!
//! [`spawn`] starts the program with exactly the environment it is given, as the leader of
//! its own process group, under limits on open files and CPU time, tied to runwarden's life
//! (it gets SIGKILL when runwarden dies, even by `kill -9`) and, by default, in its own
//! network namespace whose only interface is a loopback on which runwarden holds the egress
//! proxy's listening socket. [`kill_group`] and [`group_rss_bytes`] act on the whole
//! process group; [`probe`] says once whether the kernel gives namespaces at all.
//!
//! Every child is forked by one long-lived thread (the spawner) because the kernel sends
//! the death signal when the *thread* that forked the child ends, and tokio's threads come
//! and go. Each child's end is awaited by a small thread of its own.

mod error;
mod exit;
mod group;
mod sys;
#[cfg(test)]
mod tests;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, PoisonError, mpsc};
use std::thread;

use tokio::net::TcpListener;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::{ChildLimits, SandboxMode};
pub(crate) use error::SandboxError;
pub(crate) use exit::ExitReason;
pub(crate) use group::{Signal, group_rss_bytes, kill_group};
#[cfg(test)]
pub(crate) use sys::Step;
use sys::{ChildSetup, NamespaceSetup};

/// What the sandbox needs to know to start one local server's process.
pub(crate) struct SpawnPlan<'a> {
    /// The program, looked up on the `PATH` of `env` when it has no slash.
    pub(crate) program: &'a str,
    /// Its arguments.
    pub(crate) args: &'a [String],
    /// Its whole environment: nothing of runwarden's is passed on. May hold secrets.
    pub(crate) env: Vec<(String, String)>,
    /// Its working directory (runwarden's when absent).
    pub(crate) cwd: Option<&'a Path>,
    /// Whether it gets its own network namespace.
    pub(crate) sandbox: SandboxMode,
    /// The limits it runs under (memory is watched by the caller with [`group_rss_bytes`]).
    pub(crate) limits: ChildLimits,
    /// The port of 127.0.0.1 inside the namespace where the egress proxy listens (0: any).
    pub(crate) proxy_port: u16,
}

impl std::fmt::Debug for SpawnPlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment's values may be secrets: only the names are shown.
        let names: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("SpawnPlan")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &names)
            .field("cwd", &self.cwd)
            .field("sandbox", &self.sandbox)
            .field("limits", &self.limits)
            .field("proxy_port", &self.proxy_port)
            .finish()
    }
}

/// A started local server's process.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// Its pid, which is also its process group's id.
    pub(crate) pid: i32,
    /// Its standard input.
    pub(crate) stdin: pipe::Sender,
    /// Its standard output.
    pub(crate) stdout: pipe::Receiver,
    /// Its standard error.
    pub(crate) stderr: pipe::Receiver,
    /// In a namespace: the socket listening on 127.0.0.1:proxy_port *inside* the child's
    /// namespace, on which runwarden accepts the child's connections from outside.
    pub(crate) listener: Option<TcpListener>,
    /// How it ended, sent once it has ended (and been reaped).
    pub(crate) exited: oneshot::Receiver<ExitReason>,
}

/// Starts a local server's process as `plan` says. Cancel-safe: a process started for a
/// caller that has gone is killed.
pub(crate) async fn spawn(plan: SpawnPlan<'_>) -> Result<Spawned, SandboxError> {
    let (reply, answer) = oneshot::channel();
    let job = Job {
        program: plan.program.to_owned(),
        args: plan.args.to_vec(),
        env: plan.env,
        cwd: plan.cwd.map(Path::to_path_buf),
        sandbox: plan.sandbox,
        limits: plan.limits,
        proxy_port: plan.proxy_port,
        reply,
    };
    spawner()?
        .send(job)
        .map_err(|_| SandboxError::SpawnerStopped)?;
    // No await after this one: the started process is made ours before anything can
    // cancel this future.
    let started = answer.await.map_err(|_| SandboxError::SpawnerStopped)??;
    started.into_spawned()
}

/// Whether this kernel gives a local server a network namespace, tried once in a
/// throwaway process; later calls answer the same.
pub(crate) fn probe() -> Result<(), SandboxError> {
    static PROBED: Mutex<Option<Result<(), sys::Failure>>> = Mutex::new(None);
    let mut probed = PROBED.lock().unwrap_or_else(PoisonError::into_inner);
    let answer = match *probed {
        Some(answer) => answer,
        None => {
            // A failure of our own (no descriptor, no process left) is not the kernel's
            // answer, so it is not kept.
            let answer = sys::probe_namespace().map_err(|source| SandboxError::System {
                what: "trying a network namespace",
                source,
            })?;
            *probed = Some(answer);
            answer
        }
    };
    answer.map_err(|(step, errno)| SandboxError::Namespace { step, errno })
}

/// One process to start, sent to the spawner thread.
struct Job {
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    sandbox: SandboxMode,
    limits: ChildLimits,
    proxy_port: u16,
    reply: oneshot::Sender<Result<Started, SandboxError>>,
}

/// A process the spawner started, its pipes still std's.
struct Started {
    pid: i32,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
    listener: Option<OwnedFd>,
    exited: oneshot::Receiver<ExitReason>,
}

/// The spawner thread's queue, the thread started on first use.
fn spawner() -> Result<mpsc::Sender<Job>, SandboxError> {
    static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    let mut slot = SPAWNER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(queue) = &*slot {
        return Ok(queue.clone());
    }
    let (queue, jobs) = mpsc::channel::<Job>();
    thread::Builder::new()
        .name("runwarden-stdio-spawner".into())
        .spawn(move || {
            for job in jobs {
                job.run();
            }
        })
        .map_err(|source| SandboxError::System {
            what: "starting the thread that starts local servers",
            source,
        })?;
    *slot = Some(queue.clone());
    Ok(queue)
}

impl Job {
    /// Runs on the spawner thread: starts the process and answers the caller; kills it if
    /// the caller has gone.
    fn run(self) {
        let started = self.start();
        if let Err(Ok(orphan)) = self.reply.send(started) {
            kill_group(orphan.pid, Signal::Kill);
        }
    }

    /// Starts the process; on failure nothing of it is left running.
    fn start(&self) -> Result<Started, SandboxError> {
        // Checked here because a failed chdir in the child would read as a missing program.
        if let Some(cwd) = &self.cwd {
            let directory = std::fs::metadata(cwd).and_then(|found| match found.is_dir() {
                true => Ok(()),
                false => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            });
            if let Err(source) = directory {
                let path = cwd.clone();
                return Err(SandboxError::Directory { path, source });
            }
        }
        let (ours, theirs) = sys::report_pair().map_err(|source| SandboxError::System {
            what: "making the channel the sandbox reports on",
            source,
        })?;
        let namespace = match self.sandbox {
            SandboxMode::Namespace => Some(NamespaceSetup::new(Some(self.proxy_port))),
            SandboxMode::Unsandboxed => None,
        };
        let wants_listener = namespace.is_some();
        let mut command = self.command();
        let limits = self.limits;
        ChildSetup::new(
            namespace,
            limits.open_files,
            limits.cpu_seconds,
            theirs.as_raw_fd(),
        )
        .install(&mut command);
        let spawned = command.spawn();
        drop(command);
        drop(theirs);
        // Everything the child will report it has sent by now: it has exec'd or failed.
        let reports = sys::read_reports(&ours);
        let mut child = spawned.map_err(|source| match reports.failure {
            Some(failure) => {
                let (port, files, cpu) = (self.proxy_port, limits.open_files, limits.cpu_seconds);
                SandboxError::from_step(failure, port, files, cpu)
            }
            None => SandboxError::Start {
                program: self.program.clone(),
                source,
            },
        })?;
        let pid = child.id() as i32;
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            return Err(abandon(
                pid,
                "taking the server's pipes",
                io::ErrorKind::Other.into(),
            ));
        };
        if wants_listener && reports.listener.is_none() {
            let missing = io::Error::other("the sandbox sent no listening socket");
            return Err(abandon(pid, "receiving the egress proxy's socket", missing));
        }
        let exited = watch_exit(pid, limits.cpu_seconds).map_err(|source| {
            abandon(pid, "starting the thread that waits for the server", source)
        })?;
        Ok(Started {
            pid,
            stdin,
            stdout,
            stderr,
            listener: reports.listener,
            exited,
        })
    }

    /// The command: exactly `env`, three pipes, a process group of its own.
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // setpgid(0, 0) in the child: its pid is its group's id, which every process
            // it starts joins, so one signal reaches them all.
            .process_group(0);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        command
    }
}

/// Kills and reaps a process that was started but cannot be handed over, and answers the
/// error that says why.
fn abandon(pid: i32, what: &'static str, source: io::Error) -> SandboxError {
    kill_group(pid, Signal::Kill);
    let _ = sys::wait(pid);
    SandboxError::System { what, source }
}

/// Starts the thread that waits for `pid` to end and sends how it ended.
fn watch_exit(pid: i32, cpu_seconds: Option<u64>) -> io::Result<oneshot::Receiver<ExitReason>> {
    let (sender, receiver) = oneshot::channel();
    thread::Builder::new()
        .name("runwarden-stdio-wait".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let reason = match sys::wait(pid) {
                Ok((ended, cpu_used)) => ExitReason::from_wait(ended, cpu_used, cpu_seconds),
                Err(error) => ExitReason::Unknown(format!("waiting for process {pid}: {error}")),
            };
            // Nobody listening any more is fine: the process is reaped either way.
            let _ = sender.send(reason);
        })?;
    Ok(receiver)
}

impl Started {
    /// The pipes and the listener as tokio types of the caller's runtime.
    fn into_spawned(self) -> Result<Spawned, SandboxError> {
        let pid = self.pid;
        let exited = self.exited;
        let listener = self.listener;
        let pipes = (|| -> io::Result<_> {
            Ok((
                pipe::Sender::from_owned_fd(self.stdin.into())?,
                pipe::Receiver::from_owned_fd(self.stdout.into())?,
                pipe::Receiver::from_owned_fd(self.stderr.into())?,
                listener.map(tokio_listener).transpose()?,
            ))
        })();
        match pipes {
            Ok((stdin, stdout, stderr, listener)) => Ok(Spawned {
                pid,
                stdin,
                stdout,
                stderr,
                listener,
                exited,
            }),
            Err(source) => {
                // The waiting thread reaps it.
                kill_group(pid, Signal::Kill);
                Err(SandboxError::System {
                    what: "connecting to the server's pipes",
                    source,
                })
            }
        }
    }
}

fn tokio_listener(fd: OwnedFd) -> io::Result<TcpListener> {
    let listener = std::net::TcpListener::from(fd);
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}
