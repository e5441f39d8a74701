//! A local server as the operator declared it: the program, its arguments, the
//! environment it gets (literal values and secrets from the vault), its directory, the
//! sandbox it runs in and the limits it runs under.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use runwarden_vault::SecretName;

/// The default time a cancelled call's handler gets to end after
/// `notifications/cancelled` before the server's process group is killed.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(2);

/// The default memory limit of a local server, in MiB.
pub const DEFAULT_MEMORY_MB: u64 = 1024;

/// The default limit on a local server's open files.
pub const DEFAULT_OPEN_FILES: u64 = 1024;

/// One environment variable of a local server. A literal is configuration, shown like
/// the server's arguments (a reload compares it); a credential goes in a vault secret,
/// of which only the name is ever shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// A value written in the configuration.
    Literal(String),
    /// A secret from the vault, read when the server starts.
    Secret(SecretName),
}

/// Where a local server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Its own network namespace (through a user namespace when not root) whose only
    /// reachable address is the egress proxy on its loopback; the server does not start
    /// where the kernel refuses the namespace.
    #[default]
    Namespace,
    /// A plain child process with the host's network: only when the operator says so.
    Unsandboxed,
}

impl SandboxMode {
    /// The stable name used in configuration and shown by `mcp list`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::Unsandboxed => "none",
        }
    }

    /// Parses a configured name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Namespace, Self::Unsandboxed]
            .into_iter()
            .find(|m| m.as_str() == text)
    }
}

/// The limits a local server runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildLimits {
    /// The most memory (resident, summed over its process group) before it is stopped.
    pub memory_mb: u64,
    /// The most CPU time, in seconds, each of its processes may use (none: no limit).
    pub cpu_seconds: Option<u64>,
    /// The most files each of its processes may have open.
    pub open_files: u64,
}

impl Default for ChildLimits {
    fn default() -> Self {
        Self {
            memory_mb: DEFAULT_MEMORY_MB,
            cpu_seconds: None,
            open_files: DEFAULT_OPEN_FILES,
        }
    }
}

/// How long a local server's process lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lifetime {
    /// One process for every run of the runwarden process, started on first use.
    #[default]
    Process,
    /// One process for each run (each stretch a worker runs it), stopped when it ends:
    /// no state of one run's server reaches another run.
    Run,
}

impl Lifetime {
    /// The stable name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Run => "run",
        }
    }

    /// Parses a configured name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Process, Self::Run]
            .into_iter()
            .find(|l| l.as_str() == text)
    }
}

/// `[mcp.servers.NAME]` with `command`: a server spoken to over its stdin and stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioConfig {
    /// The program, found on `PATH` when it has no slash.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment: nothing of runwarden's own is passed on but `PATH`.
    pub env: BTreeMap<String, EnvValue>,
    /// Its working directory (runwarden's when absent).
    pub cwd: Option<PathBuf>,
    /// Where it runs.
    pub sandbox: SandboxMode,
    /// What it may use.
    pub limits: ChildLimits,
    /// How long a cancelled call's handler gets before the process group is killed.
    pub cancel_grace: Duration,
    /// One process for all runs, or one per run.
    pub lifetime: Lifetime,
}

impl StdioConfig {
    /// A sandboxed server running `command` with `args`, default limits and grace.
    pub fn new(command: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            command: command.into(),
            args,
            env: BTreeMap::new(),
            cwd: None,
            sandbox: SandboxMode::default(),
            limits: ChildLimits::default(),
            cancel_grace: DEFAULT_CANCEL_GRACE,
            lifetime: Lifetime::default(),
        }
    }

    /// The command line as `mcp list` shows it (arguments joined by spaces).
    pub fn command_line(&self) -> String {
        std::iter::once(self.command.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}
