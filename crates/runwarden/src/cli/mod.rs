//! The command line: one clap tree, one module per command group.

pub(crate) mod audit;
mod backup;
mod completions;
mod decisions;
mod doctor;
mod egress;
pub(crate) mod init;
pub(crate) mod mcp;
mod mcp_auth;
mod mcp_edit;
mod mcp_refusal;
mod new_key;
mod policy;
pub(crate) mod run;
mod run_remote;
mod runs;
mod secret;
mod serve;
mod signals;
mod token;
pub(crate) mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use runwarden_vault::{EgressClient, Vault};

use crate::config::Config;
use crate::root::{Root, Store};

/// The environment variable that stands for `--server`.
const SERVER_ENV: &str = "RUNWARDEN_SERVER";

/// runwarden: durable tool-calling agent runs behind a credential vault.
#[derive(Debug, Parser)]
#[command(name = "runwarden", version, about)]
pub(crate) struct Cli {
    /// The configuration file [default: $RUNWARDEN_CONFIG, else ./runwarden.toml]
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Talk to a running `runwarden serve` at this URL instead of the store (run, runs,
    /// status, cancel, events, enqueue, decisions, mcp list|health, audit); the token comes
    /// from $RUNWARDEN_TOKEN or [client] token_file. Commands that only work on the local
    /// installation refuse it.
    #[arg(long, global = true, value_name = "URL", env = SERVER_ENV)]
    server: Option<String>,
    /// How log lines (stderr) are written [default: [log] format, else text]; the level
    /// comes from $RUNWARDEN_LOG (default warn).
    #[arg(long, global = true, value_enum, env = "RUNWARDEN_LOG_FORMAT")]
    log_format: Option<crate::config::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// `[telemetry] otlp_endpoint` of the configuration file, if set and valid.
    pub(crate) fn otlp_endpoint(&self) -> Option<String> {
        crate::config::peek_otlp_endpoint(&Config::locate(self.config.as_deref()))
    }

    /// The log format: `--log-format` or `$RUNWARDEN_LOG_FORMAT`, else the configuration
    /// file's `[log] format`, else text.
    pub(crate) fn log_format(&self) -> crate::config::LogFormat {
        self.log_format.unwrap_or_else(|| {
            crate::config::LogFormat::peek(&Config::locate(self.config.as_deref()))
        })
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A self-contained tour: a run cancelled while its tool call is on the wire.
    Demo(crate::demo::DemoArgs),
    /// Write runwarden.toml, create the data directory, the database and a master key.
    Init(init::InitArgs),
    /// Store, list, remove secrets and rotate the master key.
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// Check what the egress policy allows with one guarded request.
    #[command(subcommand)]
    Egress(egress::EgressCommand),
    /// Read and verify the audit log of outbound calls.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Import MCP servers' tools, list them, check liveness, call a tool.
    #[command(subcommand)]
    Mcp(mcp::McpCommand),
    /// Run an agent synchronously, printing each step; Ctrl-C cancels the run.
    Run(run::RunArgs),
    /// List runs, newest first.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Cancel a run, or one call of a gateway session (exit 0 when it cancelled it).
    Cancel(run::CancelArgs),
    /// A run's status, termination reason, rounds, lease holder and pending effect.
    Status(run::RunIdArgs),
    /// A run's events; --follow keeps printing until it ends.
    Events(run::EventsArgs),
    /// Store a run for a worker; prints its id.
    Enqueue(worker::EnqueueArgs),
    /// Claim and execute queued runs until stopped (SIGTERM drains, a second exits).
    Worker(worker::WorkerArgs),
    /// Requeue or dead-letter every run whose lease expired, once.
    Reap,
    /// The HTTP API and the workers in one process (SIGTERM drains, a second exits).
    Serve(serve::ServeArgs),
    /// Create, list and revoke the API's bearer tokens.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Operator decisions runs wait on (approvals, uncertain effects, server questions).
    #[command(subcommand)]
    Decisions(DecisionsCommand),
    /// Approve a pending call (optionally with edited arguments); a worker then makes it.
    Approve(decisions::ApproveArgs),
    /// Deny a pending call; the model reads "denied by an operator: REASON".
    Deny(decisions::DenyArgs),
    /// Say what an uncertain write did: --applied, --not-applied, or --cancel the run.
    Resolve(decisions::ResolveArgs),
    /// Answer a server's question: --content JSON, --decline or --cancel.
    Answer(decisions::AnswerArgs),
    /// Check the installation (database integrity, free space, file modes, key and
    /// anchor, write-ahead log, workers, store) and say what to do; exit 1 on a problem.
    Doctor,
    /// Copy the SQLite database while it runs, with its audit anchor beside it.
    Backup(backup::BackupArgs),
    /// Print a shell completion script: `runwarden completions bash > /etc/bash_completion.d/runwarden`.
    Completions(completions::CompletionsArgs),
    /// Cedar policies over every tool call: check them, ask them about one call, or run
    /// a table of expected decisions.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
}

impl Command {
    /// The command's name when it works on the local installation alone (no API route does
    /// what it does), so `--server` is refused rather than silently ignored.
    fn local_only(&self) -> Option<&'static str> {
        match self {
            Self::Demo(_) => Some("demo"),
            Self::Init(_) => Some("init"),
            Self::Secret(_) => Some("secret"),
            Self::Egress(_) => Some("egress"),
            Self::Mcp(command) => command.local_only(),
            Self::Worker(_) => Some("worker"),
            Self::Reap => Some("reap"),
            Self::Serve(_) => Some("serve"),
            Self::Token(_) => Some("token"),
            Self::Doctor => Some("doctor"),
            Self::Backup(_) => Some("backup"),
            Self::Policy(_) => Some("policy"),
            _ => None,
        }
    }
}

/// A command line that cannot work as given (a named configuration file that does not
/// exist, `--server` on a local-only command): exit status 2, like clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Misuse(pub(crate) String);

/// The exit status of a [`Misuse`].
const EXIT_MISUSE: u8 = 2;

#[derive(Debug, Subcommand)]
enum DecisionsCommand {
    /// Pending decisions (or a run's, with --run).
    List(decisions::ListArgs),
}

/// What every command gets: the resolved configuration, the output mode, and the process's
/// composition root (the one place the store and everything above it are built).
pub(crate) struct Context {
    pub(crate) config: Config,
    pub(crate) json: bool,
    /// The server to talk to instead of the store (`--server`), if any.
    pub(crate) server: Option<crate::client::ApiClient>,
    /// Builds the backend and what sits on it, once, on first use.
    pub(crate) root: Arc<Root>,
}

impl Context {
    /// A command's context over a fresh root for `config`.
    pub(crate) fn new(
        config: Config,
        json: bool,
        server: Option<crate::client::ApiClient>,
    ) -> Self {
        let root = Arc::new(Root::new(config.clone()));
        Self {
            config,
            json,
            server,
            root,
        }
    }

    /// Every seam of the process's one backend; refuses to create a database (that is
    /// `init`'s job).
    pub(crate) async fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        self.root.store().await
    }

    /// The vault, opened with the configured master key.
    pub(crate) async fn vault(&self) -> anyhow::Result<Arc<Vault>> {
        self.root.vault().await
    }

    /// The guarded egress client over the vault.
    pub(crate) async fn egress(&self) -> anyhow::Result<Arc<EgressClient>> {
        self.root.egress().await
    }
}

/// Runs one command; the exit code says how it went.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let json = cli.json;
    match run_command(cli).await {
        Err(error) if error.downcast_ref::<Misuse>().is_some() => {
            crate::output::error(json, &error);
            Ok(ExitCode::from(EXIT_MISUSE))
        }
        outcome => outcome,
    }
}

async fn run_command(cli: Cli) -> anyhow::Result<ExitCode> {
    // A core of a process with a call in flight holds the secret being placed and the raw
    // master key. The long-running commands that hold both refuse to start without this.
    if let Err(problem) = crate::harden::no_core_dumps() {
        if matches!(
            cli.command,
            Command::Serve(_) | Command::Worker(_) | Command::Run(_)
        ) {
            anyhow::bail!("{problem}: refusing to hold secrets in a process that could dump core");
        }
        eprintln!("warning: {problem}; a core dump of this process could hold secrets");
    }
    // `--server` (or $RUNWARDEN_SERVER) is an explicit request to work through a server: a
    // command that cannot says so instead of quietly using the local store. A `[client]
    // server` in the file is only a default for the commands that can.
    if let (Some(_), Some(name)) = (&cli.server, cli.command.local_only()) {
        return Err(Misuse(format!(
            "`runwarden {name}` works on the local installation, not through a server: drop --server (and unset ${SERVER_ENV})"
        ))
        .into());
    }
    // The demo brings its own temporary installation, and completions are the command
    // tree alone: no configuration is read.
    let command = match cli.command {
        Command::Demo(args) => return crate::demo::run(cli.json, args).await,
        Command::Completions(args) => return completions::print(args),
        command => command,
    };
    // A configuration the operator named must exist: a typo is not a silent default.
    // `init` is how one is created.
    if let Some(named) = Config::named(cli.config.as_deref())
        && !matches!(command, Command::Init(_))
        && !named.exists()
    {
        return Err(Misuse(format!(
            "the configuration file {} does not exist: run `runwarden init` with the same --config (or ${}) to create it, or fix the path",
            named.display(),
            crate::config::CONFIG_ENV
        ))
        .into());
    }
    let path = Config::locate(cli.config.as_deref());
    // The policy commands read the policy files alone: they must work when the policies
    // would refuse the start.
    let command = match command {
        Command::Policy(command) => return policy::run(cli.json, &path, command),
        command => command,
    };
    let config = Config::load(&path)?;
    let server = match cli.server.as_deref().or(config.client_server.as_deref()) {
        Some(url) => Some(crate::client::ApiClient::new(url, config.client_token()?)?),
        None => None,
    };
    let cx = Context::new(config, cli.json, server);
    let outcome = dispatch(&cx, command).await;
    // M13: every command ends the MCP sessions it opened, whatever its outcome.
    cx.root.shutdown().await;
    outcome
}

async fn dispatch(cx: &Context, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        // Dispatched above, before any configuration is read; kept for exhaustiveness.
        Command::Demo(args) => crate::demo::run(cx.json, args).await,
        Command::Init(args) => init::run(cx, args).await,
        Command::Secret(command) => secret::run(cx, command).await,
        Command::Egress(command) => egress::run(cx, command).await,
        Command::Audit(command) => audit::run(cx, command).await,
        Command::Mcp(command) => mcp::run(cx, command).await,
        Command::Run(args) => match &cx.server {
            Some(server) => run_remote::run(cx, server, args).await,
            None => run::run(cx, args).await,
        },
        Command::Runs(command) => runs::run(cx, command).await,
        Command::Cancel(args) => run::cancel(cx, args).await,
        Command::Status(args) => run::status(cx, args).await,
        Command::Events(args) => run::events(cx, args).await,
        Command::Enqueue(args) => worker::enqueue(cx, args).await,
        Command::Worker(args) => worker::worker(cx, args).await,
        Command::Reap => worker::reap_once(cx).await,
        Command::Serve(args) => serve::serve(cx, args).await,
        Command::Token(command) => token::run(cx, command).await,
        Command::Decisions(DecisionsCommand::List(args)) => decisions::list(cx, args).await,
        Command::Approve(args) => decisions::approve(cx, args).await,
        Command::Deny(args) => decisions::deny(cx, args).await,
        Command::Resolve(args) => decisions::resolve(cx, args).await,
        Command::Answer(args) => decisions::answer(cx, args).await,
        Command::Doctor => doctor::run(cx).await,
        Command::Backup(args) => backup::run(cx, args).await,
        // Dispatched above, before any configuration is read.
        Command::Completions(args) => completions::print(args),
        Command::Policy(command) => policy::run(cx.json, &cx.config.path, command),
    }
}
