//! `runwarden.toml`: one file, environment overrides, paths relative to the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use runwarden_mcp::{Effect, ElicitationPolicy, ServerConfig};
use runwarden_oauth::{
    AssertionSource, AuthMethod, Grant, IdentityProvider, OAuthSettings, SigningAlg,
};
use runwarden_store_postgres::PgOptions;
use runwarden_vault::{
    Algorithm, Credential, EgressConfig, EgressPolicy, MAX_TICK, MasterKey, Placement, SecretName,
};
use serde::Deserialize;

use crate::store_url::StoreUrl;

/// The environment variable that names the config file when `--config` is absent.
pub(crate) const CONFIG_ENV: &str = "RUNWARDEN_CONFIG";
/// The store URL, which overrides the configuration file's `[store]`.
pub(crate) const DATABASE_URL_ENV: &str = "RUNWARDEN_DATABASE_URL";
/// A master key given as 64 hex characters instead of a key file.
pub(crate) const MASTER_KEY_ENV: &str = "RUNWARDEN_MASTER_KEY";

/// The commented file `runwarden init` writes.
pub(crate) const TEMPLATE: &str = r#"# runwarden configuration. Relative paths are relative to this file.
# Every setting here can be overridden from the environment, e.g. RUNWARDEN_DATA_DIR.

# Where the SQLite database and the master key live (RUNWARDEN_DATA_DIR).
data_dir = ".runwarden"

[store]
# The embedded SQLite database (RUNWARDEN_SQLITE_PATH). Default: <data_dir>/runwarden.db
# sqlite_path = ".runwarden/runwarden.db"
# Or a store URL instead (RUNWARDEN_DATABASE_URL, which wins over everything here):
# "sqlite:PATH", or "postgres://USER@HOST:5432/DATABASE" for many nodes on one database
# (keep a password out of this file: put the whole URL in RUNWARDEN_DATABASE_URL).
# url = "sqlite:.runwarden/runwarden.db"
# PostgreSQL only: every store call is bounded. The server cancels a statement after
# statement_timeout_seconds; the client gives up on a whole call after call_timeout_seconds
# (a link that stays open but answers nothing) and the call is retried later.
# statement_timeout_seconds = 10
# call_timeout_seconds = 20

[vault]
# The master key file, mode 0600 (RUNWARDEN_MASTER_KEY_FILE). Default: <data_dir>/master.key
# Alternatively set RUNWARDEN_MASTER_KEY to the key's 64 hex characters.
# master_key_file = ".runwarden/master.key"
# The AEAD for new secrets: "xchacha20poly1305" (default) or "aes256gcm".
algorithm = "xchacha20poly1305"
# The audit log's witness outside the database, mode 0600 (RUNWARDEN_AUDIT_ANCHOR_FILE):
# `audit verify` detects a wipe or a rollback of the log through it. Back it up with the
# database. Default: <data_dir>/audit.anchor
# audit_anchor_file = ".runwarden/audit.anchor"

# A witness the local administrator cannot rewrite silently: every advance of the anchor is
# appended to this file, opened append-only (put it on another machine's mount, or make it
# append-only with chattr +a). `audit verify --witness` checks the log against it.
# [audit]
# witness = "/mnt/audit-witness/runwarden.witness"

[egress]
# Private targets the vault may reach: exact hosts, addresses or CIDRs
# (RUNWARDEN_EGRESS_ALLOW, comma-separated). Public targets need no entry.
allow = []
# allow = ["127.0.0.1", "10.1.2.0/24", "mcp.internal.example"]
connect_timeout_seconds = 10
timeout_seconds = 30

# MCP servers (Streamable HTTP). Tools become <server>__<tool> after `runwarden mcp import`.
# [mcp.servers.tickets]
# url = "https://mcp.example.com/mcp"
# auth = { secret = "tickets-token", placement = "bearer" }  # or "basic"; "header" with
#                                      # header = "X-Api-Key" (and prefix); "query" with param
# auth = { oauth = { grant = "client_credentials", client_id = "agent", client_secret = "tickets-client" } }
#                                      # or grant = "authorization_code" and `runwarden mcp login`
#                                      # or grant = "jwt_bearer" with assertion_file (or
#                                      # assertion_command); or grant = "cross_app_access" with
#                                      # id_token_file, idp_token_endpoint, idp_client_id
# effect = "non_idempotent_write"      # the default; or "idempotent_write", "read_only"
# timeout_seconds = 20                 # one budget per operation, spent across its legs (at least 1)
# max_response_bytes = 2097152         # a longer answer is refused, its size named
# approval = "required"               # every call waits for an operator (default "none")
# approval_timeout_seconds = 86400     # then it is denied as "expired" (default 24 h)
# elicitation = "decline"              # the default; "operator" asks a person (an input decision)
# progress_extends_deadline = false    # true: progress restarts the budget (at most 600 s in all)
# protocol = "auto"                    # 2026-07-28 when served, else 2025-11-25; "2025-11-25" never probes
# [mcp.servers.tickets.tools.search]
# effect = "read_only"
# approval = "none"                    # a tool's own policy beats its server's

# Agents: a model and the imported tools it may call (patterns: exact or prefix*).
# [agents.helper]
# provider = "openai"                  # any OpenAI-compatible base_url; or "anthropic", "scripted"
# model = "gpt-4o-mini"
# base_url = "https://api.openai.com/v1"
# api_key_secret = "openai"            # a vault secret; placed at the wire, never read here
# system = "You are a careful helpdesk agent."
# tools = ["tickets__search", "tickets__create", "files__*"]
# max_rounds = 20
# timeout_seconds = 120                # per model call
# max_tokens = 4096                    # output limit per model call (the default)
# max_output_tokens_total = 50000      # budgets per run; a run request may only lower them
# max_wall_seconds = 600               # from the run's creation
# max_tool_calls = 50
# approve = ["tickets__create"]        # these tools wait for an operator's approval
# approval_timeout_seconds = 3600
# (provider = "anthropic" may leave out api_key_secret for a server that needs no key, and
#  may set anthropic_version = "2023-06-01", the header it sends; that is the default)
# (provider = "scripted" takes script = "plan.json" instead of model and key)

# Workers (`runwarden worker`, `runwarden serve`) for queued runs.
[worker]
lease_seconds = 30          # a dead worker's run is recovered within this
heartbeat_seconds = 10      # leases are renewed in the background, calls in flight too
concurrency = 4
max_requeues = 3            # retries of retryable failures and stale reclaims, together
# status_refresh_seconds = 1 # re-read runs with a call in flight (cancels also wake them)

# The HTTP API (`runwarden serve`) against slow or idle clients.
# [serve]
# max_connections = 1024           # default: half the open-file limit, at most 4096
# max_connections_per_client = 256 # from one address (IPv6: its /64); default a quarter of the cap
# header_read_timeout_seconds = 10 # a request's head must arrive within this
# body_read_timeout_seconds = 30   # and its body within this
# idle_timeout_seconds = 60        # a keep-alive connection with no request is closed
# tls_cert = "tls/cert.pem"        # HTTPS: the certificate chain (PEM, leaf first) ...
# tls_key = "tls/key.pem"          # ... and its private key (PEM); both or neither

# Who may read /metrics (Prometheus/OpenMetrics text).
# [metrics]
# require_token = true             # false: /metrics on the API port needs no token
# listen = "127.0.0.1:9464"        # or a port of its own serving /metrics alone, no token

# OpenTelemetry traces over OTLP/HTTP: a run, its steps, each outbound call, API requests.
# [telemetry]
# otlp_endpoint = "http://127.0.0.1:4318"
# record_arguments = false         # true puts each tool call's arguments on its span

# The web console at / (sign in with an API token).
# [console]
# session_hours = 12               # how long a sign-in lasts (1 to 720)

# Log lines on stderr; the level comes from RUNWARDEN_LOG (default warn).
# [log]
# format = "text"                  # or "json": one object per line (--log-format overrides)
"#;

/// The configuration file.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct FileConfig {
    /// Where the database, the master key and the audit anchor live, relative to this file. Default `.runwarden`. Env: `RUNWARDEN_DATA_DIR`.
    data_dir: Option<PathBuf>,
    /// Where runs, secrets and the audit log are stored.
    #[serde(default)]
    store: StoreSection,
    /// The master key and the encryption of secrets.
    #[serde(default)]
    vault: VaultSection,
    /// The audit log's external witness.
    #[serde(default)]
    audit: AuditSection,
    /// Which hosts outbound calls may reach and their timeouts.
    #[serde(default)]
    egress: EgressSection,
    /// MCP servers whose tools agents may call.
    #[serde(default)]
    mcp: McpSection,
    /// Agents by name: a model and the tools it may call.
    #[serde(default)]
    agents: BTreeMap<String, AgentSection>,
    /// Queued runs: leases, heartbeats, concurrency, retries.
    #[serde(default)]
    worker: WorkerSection,
    /// The CLI talking to a running `runwarden serve` (`--server`).
    #[serde(default)]
    client: ClientSection,
    /// The HTTP API (`runwarden serve`).
    #[serde(default)]
    serve: ServeSection,
    /// Log lines on stderr.
    #[serde(default)]
    log: LogSection,
    /// Who may read `/metrics`.
    #[serde(default)]
    metrics: MetricsSection,
    /// OpenTelemetry traces.
    #[serde(default)]
    telemetry: TelemetrySection,
    /// The web console (`runwarden serve` at `/`).
    #[serde(default)]
    console: ConsoleSection,
}

/// `[console]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ConsoleSection {
    /// How long a console sign-in lasts, in hours (1 to 720). Default `12`. Revoking the token ends its sessions at once.
    session_hours: Option<u64>,
}

/// `[console]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsoleSettings {
    /// How long a console session lasts after sign-in.
    pub(crate) session: Duration,
}

fn console_settings(section: ConsoleSection) -> anyhow::Result<ConsoleSettings> {
    let hours = section.session_hours.unwrap_or(12);
    if !(1..=720).contains(&hours) {
        bail!("[console] session_hours must be between 1 and 720 (30 days), not {hours}");
    }
    Ok(ConsoleSettings {
        session: Duration::from_secs(hours * 3600),
    })
}

/// `[telemetry]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct TelemetrySection {
    /// The OTLP/HTTP collector (`http://127.0.0.1:4318`); spans go to `<endpoint>/v1/traces`. Default: none, no traces. Span attributes never hold a secret or a header, nor an argument value unless `record_arguments` is set.
    otlp_endpoint: Option<String>,
    /// Put each tool call's arguments, as the model produced them, on its `tool_call` span (attribute `arguments`). Default `false`: arguments may hold personal data. Secrets are never in them (the vault places credentials at the wire).
    record_arguments: Option<bool>,
}

/// `[telemetry] otlp_endpoint` of the file at `path`, read before the configuration is
/// loaded (the tracing subscriber is built first); [`Config::load`] reports a bad one.
pub(crate) fn peek_otlp_endpoint(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let table = toml::from_str::<toml::Table>(&text).ok()?;
    let endpoint = table.get("telemetry")?.get("otlp_endpoint")?.as_str()?;
    otlp_endpoint(endpoint).ok()
}

/// A collector URL: http or https, with a host, no query or credentials (it would go in
/// every log of the exporter's errors).
fn otlp_endpoint(text: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(text).map_err(|e| {
        anyhow::anyhow!("[telemetry] otlp_endpoint {text:?} is not a URL ({e}): give the collector's base, like \"http://127.0.0.1:4318\"")
    })?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || url.query().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        bail!(
            "[telemetry] otlp_endpoint must be an http(s) URL with a host and no query or credentials, like \"http://127.0.0.1:4318\""
        );
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// `mcp.servers.t.tools.search.efect: ` for a parse error about a key (an unknown field),
/// so the message names the key with its table and not only a line number; empty when
/// the error is not about a bare key on its own line.
fn key_of_error(text: &str, error: &toml::de::Error) -> String {
    let Some(span) = error.span() else {
        return String::new();
    };
    let Some(key) = text.get(span.clone()) else {
        return String::new();
    };
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !bare || !text[line_start..span.start].trim().is_empty() {
        return String::new();
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('['))
        .and_then(|line| line.split(']').next())
        .map(|header| header.trim_start_matches('[').trim());
    match table {
        Some(table) => format!("{table}.{key}: "),
        None => format!("{key}: "),
    }
}

/// A URL runwarden sends requests to (an MCP server, a model API, the CLI's server):
/// http or https with a host, checked when the file loads so the error names the key
/// (`mcp.servers.tickets.url: ...`) instead of surfacing at the first call.
pub(crate) fn http_url(key: &str, text: &str) -> anyhow::Result<()> {
    let example = "like \"https://mcp.example.com/mcp\"";
    let url = url::Url::parse(text.trim()).map_err(|e| {
        anyhow::anyhow!("{key}: {text:?} is not a URL ({e}): write an http(s) URL, {example}")
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!(
            "{key}: {text:?} has scheme {:?}: runwarden only talks http and https, {example}",
            url.scheme()
        );
    }
    if url.host_str().is_none_or(str::is_empty) {
        bail!("{key}: {text:?} has no host: write an http(s) URL, {example}");
    }
    Ok(())
}

/// `[metrics]`: who may read `/metrics`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct MetricsSection {
    /// `/metrics` on the API port needs a viewer token. Default `true`.
    require_token: Option<bool>,
    /// An address (`127.0.0.1:9464`) where `/metrics` is served alone, without a token. Default: none.
    listen: Option<String>,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsSettings {
    /// `/metrics` on the API port needs a viewer token (the default).
    pub(crate) require_token: bool,
    /// A second listener that serves `/metrics` alone, without a token (bind it where only
    /// the scraper reaches).
    pub(crate) listen: Option<String>,
}

/// `[log]`: how the process writes its log lines (stderr).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct LogSection {
    /// `text` or `json` (one object per line). Default `text`. `--log-format` and `RUNWARDEN_LOG_FORMAT` override it; the level comes from `RUNWARDEN_LOG` (default `warn`).
    format: Option<String>,
}

/// How log lines are written: for people, or one JSON object per line for machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// `2026-12-03T10:00:00Z  INFO runwarden::http: request method=GET ...`
    #[default]
    Text,
    /// `{"timestamp": ..., "level": "INFO", "fields": {...}, "target": ...}`
    Json,
}

impl LogFormat {
    fn parse(at: &str, text: &str) -> anyhow::Result<Self> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => bail!("{at}: unknown log format {other:?}: use \"text\" or \"json\""),
        }
    }

    /// `[log] format` of the file at `path`, read before the configuration is loaded (the
    /// log must exist to report a bad configuration). Anything unreadable is left to
    /// [`Config::load`] to report; here it means the default.
    pub(crate) fn peek(path: &Path) -> Self {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
            .and_then(|table| {
                let format = table.get("log")?.get("format")?.as_str()?.to_string();
                Self::parse("[log] format", &format).ok()
            })
            .unwrap_or_default()
    }
}

/// `[serve]`: what the API gives a client.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ServeSection {
    /// Connections served at once; the rest wait in the kernel's backlog. Default: half the open-file limit, 16 to 4096.
    max_connections: Option<usize>,
    /// Connections served at once from one client address (an IPv6 client by its /64); more are answered 503 at once. Behind a reverse proxy on this host every client has the proxy's address: set it to `max_connections`. Default: a quarter of `max_connections`.
    max_connections_per_client: Option<usize>,
    /// A request's head must arrive within this, from the connection or its first byte. Default `10`.
    header_read_timeout_seconds: Option<f64>,
    /// A request's body must arrive within this, from the end of its head; a slower one is answered 408. Default `30`.
    body_read_timeout_seconds: Option<f64>,
    /// A keep-alive connection with no request in flight is closed after this; never a live stream. Default `60`.
    idle_timeout_seconds: Option<f64>,
    /// HTTPS: the certificate chain, PEM, leaf first (with `tls_key`). Default: plain HTTP.
    tls_cert: Option<PathBuf>,
    /// HTTPS: the certificate's private key, PEM (with `tls_cert`).
    tls_key: Option<PathBuf>,
}

/// `[serve]`: what the API gives a client before it closes the connection.
#[derive(Debug, Clone)]
pub(crate) struct ServeSettings {
    /// Connections served at once; `None` derives it from the open-file limit at start.
    pub(crate) max_connections: Option<usize>,
    /// Connections served at once from one client address; `None`: a quarter of the cap.
    pub(crate) max_connections_per_client: Option<usize>,
    /// How long a client has to send a request's head, from its connection or from the
    /// first byte of the request.
    pub(crate) header_read_timeout: Duration,
    /// How long a client has to send a request's body, from the end of its head.
    pub(crate) body_read_timeout: Duration,
    /// How long a keep-alive connection may sit with no request in flight.
    pub(crate) idle_timeout: Duration,
    /// `[serve] tls_cert` and `tls_key`: HTTPS instead of HTTP.
    pub(crate) tls: Option<TlsFiles>,
}

/// The PEM files `serve` speaks TLS with: the certificate chain (leaf first) and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

fn serve_settings(
    section: ServeSection,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<ServeSettings> {
    let tls = match (section.tls_cert, section.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: resolve(cert),
            key: resolve(key),
        }),
        (None, None) => None,
        _ => bail!(
            "[serve] tls_cert and tls_key go together: set both (PEM files: the certificate chain and its private key) or neither"
        ),
    };
    if let Some(max) = section.max_connections
        && !(1..=1_000_000).contains(&max)
    {
        bail!("[serve] max_connections must be between 1 and 1000000, not {max}");
    }
    if let Some(max) = section.max_connections_per_client
        && !(1..=1_000_000).contains(&max)
    {
        bail!("[serve] max_connections_per_client must be between 1 and 1000000, not {max}");
    }
    Ok(ServeSettings {
        max_connections: section.max_connections,
        max_connections_per_client: section.max_connections_per_client,
        header_read_timeout: seconds(
            "[serve] header_read_timeout_seconds",
            section.header_read_timeout_seconds.unwrap_or(10.0),
        )?,
        body_read_timeout: seconds(
            "[serve] body_read_timeout_seconds",
            section.body_read_timeout_seconds.unwrap_or(30.0),
        )?,
        idle_timeout: seconds(
            "[serve] idle_timeout_seconds",
            section.idle_timeout_seconds.unwrap_or(60.0),
        )?,
        tls,
    })
}

/// `[client]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ClientSection {
    /// The server the CLI talks to by default. Env: `RUNWARDEN_SERVER`.
    server: Option<String>,
    /// Where the CLI's API token is kept (mode 0600). Env `RUNWARDEN_TOKEN` gives the token itself.
    token_file: Option<PathBuf>,
}

/// `[worker]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct WorkerSection {
    /// A dead worker's run is recovered within this. Default `30`.
    lease_seconds: Option<f64>,
    /// How often leases are renewed in the background. Default `10`.
    heartbeat_seconds: Option<f64>,
    /// Runs one process executes at once. Default `4`.
    concurrency: Option<usize>,
    /// Retries of retryable failures and stale reclaims, together. Default `3`.
    max_requeues: Option<u32>,
    /// The first retry's backoff; it doubles, with jitter. Default `2`.
    retry_base_seconds: Option<f64>,
    /// How often a worker looks for runs whose lease ran out. Default: a tenth of the lease, 0.05 to 5.
    reap_seconds: Option<f64>,
    /// How long a drain waits for runs to reach a step boundary. Default `30`.
    grace_seconds: Option<f64>,
    /// How often the status watcher re-reads runs with a call in flight (cancels also wake it). Default `1`.
    status_refresh_seconds: Option<f64>,
}

/// `[worker]`: leases, heartbeats, concurrency, retries.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSettings {
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) concurrency: usize,
    pub(crate) max_requeues: u32,
    pub(crate) retry_base: Duration,
    pub(crate) reap_every: Duration,
    pub(crate) grace: Duration,
    /// How often the process's status watcher re-reads every run with a
    /// call in flight (one batched query). Cancels announced by this process, by
    /// PostgreSQL's NOTIFY or by another process on the SQLite file arrive sooner.
    pub(crate) status_refresh: Duration,
}

fn worker_settings(section: WorkerSection) -> anyhow::Result<WorkerSettings> {
    let lease = seconds(
        "[worker] lease_seconds",
        section.lease_seconds.unwrap_or(30.0),
    )?;
    let heartbeat = seconds(
        "[worker] heartbeat_seconds",
        section.heartbeat_seconds.unwrap_or(10.0),
    )?;
    if heartbeat >= lease {
        bail!(
            "[worker] heartbeat_seconds ({}) must be shorter than lease_seconds ({}), or every lease lapses",
            heartbeat.as_secs_f64(),
            lease.as_secs_f64()
        );
    }
    let concurrency = section.concurrency.unwrap_or(4);
    if !(1..=256).contains(&concurrency) {
        bail!("[worker] concurrency must be between 1 and 256, not {concurrency}");
    }
    Ok(WorkerSettings {
        lease,
        heartbeat,
        concurrency,
        max_requeues: section.max_requeues.unwrap_or(3).min(100),
        retry_base: seconds(
            "[worker] retry_base_seconds",
            section.retry_base_seconds.unwrap_or(2.0),
        )?,
        // A dead worker's run is recovered within lease + reap interval: by default a tenth
        // of the lease (at most 5 s), so recovery stays within 1.1 leases.
        reap_every: seconds(
            "[worker] reap_seconds",
            section
                .reap_seconds
                .unwrap_or((lease.as_secs_f64() / 10.0).clamp(0.05, 5.0)),
        )?,
        grace: seconds(
            "[worker] grace_seconds",
            section.grace_seconds.unwrap_or(30.0),
        )?,
        status_refresh: status_refresh(section.status_refresh_seconds)?,
    })
}

/// `[worker] status_refresh_seconds`: 1 s by default (at most one read per second per
/// call), between 0.05 s and 60 s.
fn status_refresh(value: Option<f64>) -> anyhow::Result<Duration> {
    let refresh = seconds("[worker] status_refresh_seconds", value.unwrap_or(1.0))?;
    if !(Duration::from_millis(50)..=Duration::from_secs(60)).contains(&refresh) {
        bail!(
            "[worker] status_refresh_seconds must be between 0.05 and 60, not {}",
            refresh.as_secs_f64()
        );
    }
    Ok(refresh)
}

/// `[agents.NAME]`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct AgentSection {
    /// `openai` (any OpenAI-compatible `base_url`), `anthropic` or `scripted`.
    provider: String,
    /// The model's name (not for `scripted`).
    model: Option<String>,
    /// The API's base URL. Default `https://api.openai.com/v1` or `https://api.anthropic.com/v1`.
    base_url: Option<String>,
    /// The vault secret placed as the API key at the wire; none for a server that needs no key.
    api_key_secret: Option<String>,
    /// The system prompt.
    system: Option<String>,
    /// Imported tools the agent may call: exact local names or `prefix*` patterns.
    #[serde(default)]
    tools: Vec<String>,
    /// Model rounds before the run fails, 1 to 100. Default `20`.
    max_rounds: Option<u32>,
    /// `scripted` only: the JSON plan of turns, relative to this file.
    script: Option<PathBuf>,
    /// The bound of one model call. Default `120`.
    timeout_seconds: Option<f64>,
    /// The output limit of one model call. Default `4096`.
    max_tokens: Option<u32>,
    /// Stream model answers (a cancel then stops the generation). Default `true`.
    stream: Option<bool>,
    /// Budget per run: output tokens over all model calls. Default: none.
    max_output_tokens_total: Option<u64>,
    /// Budget per run: seconds from the run's creation. Default: none.
    max_wall_seconds: Option<u64>,
    /// Budget per run: tool calls made. Default: none.
    max_tool_calls: Option<u32>,
    /// `anthropic` only: the `anthropic-version` header. Default `2023-06-01`.
    anthropic_version: Option<String>,
    /// Tool patterns (exact or `prefix*`) whose calls wait for an operator's approval. Default: none.
    #[serde(default)]
    approve: Vec<String>,
    /// How long this agent's approvals wait before they are denied as expired. Default `86400`.
    approval_timeout_seconds: Option<f64>,
}

/// L5: the output limit per model call of an agent that sets none; a server's own default
/// may be unlimited (llama-server generates until its context is full).
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 4_096;

/// Which model an agent talks to (L1, L2).
#[derive(Debug, Clone)]
pub(crate) enum ProviderConfig {
    /// Any OpenAI-compatible chat completions endpoint.
    OpenAi {
        base_url: String,
        model: String,
        api_key: Option<SecretName>,
        max_tokens: u32,
    },
    /// Anthropic Messages; a server that needs no key (a local one) takes none, and then
    /// nothing is placed.
    Anthropic {
        base_url: String,
        model: String,
        api_key: Option<SecretName>,
        max_tokens: u32,
        /// The `anthropic-version` header (a proxy or a newer API may want another).
        version: String,
    },
    /// A plan replayed from a JSON file.
    Scripted { script: PathBuf },
}

/// An agent from `[agents.NAME]`.
#[derive(Debug, Clone)]
pub(crate) struct AgentConfig {
    pub(crate) name: String,
    pub(crate) provider: ProviderConfig,
    pub(crate) system: Option<String>,
    pub(crate) tools: Vec<String>,
    pub(crate) max_rounds: Option<u32>,
    pub(crate) timeout: Duration,
    /// L3: model calls stream (the default) so a cancel stops the generation; `false`
    /// for a server that cannot stream.
    pub(crate) stream: bool,
    /// The agent's budgets per run.
    pub(crate) budgets: runwarden_runtime::Budgets,
    /// Patterns of the tools whose calls wait for an operator's approval.
    pub(crate) approve: Vec<String>,
    /// How long this agent's approvals wait, when it says.
    pub(crate) approval_timeout: Option<Duration>,
}

impl ProviderConfig {
    /// The output limit per call the provider is built with (L5), if it has one.
    pub(crate) fn max_tokens(&self) -> Option<u32> {
        match self {
            Self::OpenAi { max_tokens, .. } | Self::Anthropic { max_tokens, .. } => {
                Some(*max_tokens)
            }
            Self::Scripted { .. } => None,
        }
    }
}

/// The `anthropic-version` header an agent sends: the configured one, or
/// [`ANTHROPIC_VERSION`](runwarden_models::ANTHROPIC_VERSION). It goes on the wire as a
/// header, so only a plain token is accepted.
fn anthropic_version(at: &str, configured: Option<String>) -> anyhow::Result<String> {
    let Some(version) = configured else {
        return Ok(runwarden_models::ANTHROPIC_VERSION.to_string());
    };
    let plain = !version.is_empty()
        && version.len() <= 64
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if !plain {
        bail!(
            "{at}: anthropic_version must be a version like \"{}\" (letters, digits, '-', '.', '_'; at most 64)",
            runwarden_models::ANTHROPIC_VERSION
        );
    }
    Ok(version)
}

fn agent(
    name: &str,
    section: AgentSection,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<AgentConfig> {
    let at = format!("[agents.{name}]");
    let secret = |s: Option<String>| -> anyhow::Result<Option<SecretName>> {
        s.map(|s| SecretName::new(s).with_context(|| format!("{at}: api_key_secret")))
            .transpose()
    };
    let model = |m: Option<String>| {
        m.with_context(|| {
            format!(
                "{at}: provider {:?} needs model = \"...\"",
                section.provider
            )
        })
    };
    let max_tokens = |n: Option<u32>| -> anyhow::Result<u32> {
        match n {
            Some(0) => {
                bail!("{at}: max_tokens must be at least 1 (the default is {DEFAULT_MAX_TOKENS})")
            }
            Some(n) => Ok(n),
            None => Ok(DEFAULT_MAX_TOKENS), // L5
        }
    };
    let budgets = runwarden_runtime::Budgets {
        max_output_tokens_total: section.max_output_tokens_total,
        max_wall_seconds: section.max_wall_seconds,
        max_tool_calls: section.max_tool_calls,
    };
    if let Some(base_url) = &section.base_url {
        http_url(&format!("agents.{name}.base_url"), base_url)?;
    }
    if section.anthropic_version.is_some() && section.provider != "anthropic" {
        bail!(
            "{at}: anthropic_version applies to provider = \"anthropic\" only: remove it, or change the provider"
        );
    }
    let provider = match section.provider.as_str() {
        "openai" => ProviderConfig::OpenAi {
            base_url: section
                .base_url
                .clone()
                .unwrap_or_else(|| "https://api.openai.com/v1".into()),
            model: model(section.model.clone())?,
            api_key: secret(section.api_key_secret.clone())?,
            max_tokens: max_tokens(section.max_tokens)?,
        },
        "anthropic" => ProviderConfig::Anthropic {
            base_url: section
                .base_url
                .clone()
                .unwrap_or_else(|| "https://api.anthropic.com/v1".into()),
            model: model(section.model.clone())?,
            api_key: secret(section.api_key_secret.clone())?,
            max_tokens: max_tokens(section.max_tokens)?,
            version: anthropic_version(&at, section.anthropic_version.clone())?,
        },
        "scripted" => ProviderConfig::Scripted {
            script: resolve(section.script.clone().with_context(|| {
                format!("{at}: provider \"scripted\" needs script = \"plan.json\"")
            })?),
        },
        other => bail!(
            "{at}: unknown provider {other:?}: use \"openai\" (any compatible base_url), \"anthropic\" or \"scripted\""
        ),
    };
    let approval_timeout = section
        .approval_timeout_seconds
        .map(|s| seconds(&format!("{at} approval_timeout_seconds"), s))
        .transpose()?;
    Ok(AgentConfig {
        name: name.to_string(),
        approve: section.approve,
        approval_timeout,
        provider,
        system: section.system,
        tools: section.tools,
        max_rounds: section.max_rounds,
        budgets,
        stream: section.stream.unwrap_or(true),
        timeout: seconds(
            &format!("{at} timeout_seconds"),
            section.timeout_seconds.unwrap_or(120.0),
        )?,
    })
}

/// `[mcp]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct McpSection {
    /// MCP servers by name; a tool's local name is `<server>__<tool>`.
    #[serde(default)]
    servers: BTreeMap<String, ServerSection>,
}

/// `[mcp.servers.NAME]`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ServerSection {
    /// The server's Streamable HTTP endpoint.
    url: String,
    /// The credential placed on every request to it.
    auth: Option<AuthSection>,
    /// The default effect of its tools: `read_only`, `idempotent_write` or `non_idempotent_write` (the default).
    effect: Option<String>,
    /// One budget per operation (the whole handshake and the call), spent across its HTTP legs. Default `20`, at least `1`.
    timeout_seconds: Option<f64>,
    /// The most of one answer that is read, in bytes; a longer one is refused with its size named. Default `2097152` (2 MiB), at most 268435456.
    max_response_bytes: Option<u64>,
    /// `required` makes every call of its tools wait for an operator's approval. Default `none`.
    approval: Option<String>,
    /// How long its approvals wait before they are denied as expired. Default `86400`.
    approval_timeout_seconds: Option<f64>,
    /// What to do with the server's questions (`elicitation/create`): `decline` (the default) or `operator` (an input decision).
    elicitation: Option<String>,
    /// Whether a progress notification restarts the `tools/call` budget (at most 600 s in all). Default `false`.
    progress_extends_deadline: Option<bool>,
    /// Which protocol revision: `auto` (the default: 2026-07-28 through `server/discover` when the server serves it, else the 2025-11-25 handshake) or `2025-11-25` (the handshake only, no probe).
    protocol: Option<String>,
    /// Per-tool settings by the tool's name on the server.
    #[serde(default)]
    tools: BTreeMap<String, ToolSection>,
}

/// `auth = { ... }`: a vault secret and its placement, or `oauth = { ... }`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct AuthSection {
    /// The vault secret to place.
    secret: Option<String>,
    /// `bearer`, `basic`, `header` (with `header`, `prefix`) or `query` (with `param`).
    placement: Option<String>,
    /// `header` placement: the header's name.
    header: Option<String>,
    /// `header` placement: text before the secret (`Token `).
    prefix: Option<String>,
    /// `query` placement: the query parameter's name.
    param: Option<String>,
    /// OAuth 2.1 instead of a secret: the vault finds the authorization server from the server's 401 and keeps the tokens.
    oauth: Option<OAuthSection>,
}

/// `auth = { oauth = { ... } }`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct OAuthSection {
    /// `client_credentials` (unattended), `authorization_code` (an operator runs `runwarden mcp login SERVER` once), `jwt_bearer` (workload identity: the platform's JWT from a file or a command) or `cross_app_access` (enterprise-managed: the user's ID token exchanged at the identity provider for an ID-JAG).
    grant: String,
    /// A pre-registered client id. Without it (and without `client_metadata_url`) the client registers itself (RFC 7591).
    client_id: Option<String>,
    /// The vault secret holding the pre-registered client's secret.
    client_secret: Option<String>,
    /// `client_secret_basic`, `client_secret_post`, `private_key_jwt` or `none`. Default: from the server's metadata.
    auth_method: Option<String>,
    /// `private_key_jwt`: the vault secret holding a PKCS#8 PEM private key.
    private_key: Option<String>,
    /// `private_key_jwt`: `ES256` (the default) or `RS256`.
    signing_alg: Option<String>,
    /// A Client ID Metadata Document URL (https), used as the client id where the authorization server supports it.
    client_metadata_url: Option<String>,
    /// Scopes to ask for when the server's challenge names none (before its `scopes_supported`).
    #[serde(default)]
    scopes: Vec<String>,
    /// Bind tokens to a DPoP key (RFC 9449). Default: when the authorization server offers ES256 proofs; `true` always, `false` never.
    dpop: Option<bool>,
    /// `jwt_bearer`: a file holding the workload's JWT, read again for every token request (it may rotate).
    assertion_file: Option<PathBuf>,
    /// `jwt_bearer`: a command (program and arguments, no shell) whose standard output is the workload's JWT; run for every token request, stopped after 15 s.
    assertion_command: Option<Vec<String>>,
    /// `cross_app_access`: a file holding the user's ID token from the enterprise identity provider, read again for every token request.
    id_token_file: Option<PathBuf>,
    /// `cross_app_access`: a command (program and arguments, no shell) whose standard output is the ID token.
    id_token_command: Option<Vec<String>>,
    /// `cross_app_access`: the identity provider's token endpoint, where the ID token is exchanged for an ID-JAG.
    idp_token_endpoint: Option<String>,
    /// `cross_app_access`: this client's id at the identity provider.
    idp_client_id: Option<String>,
    /// `cross_app_access`: the vault secret holding this client's secret at the identity provider.
    idp_client_secret: Option<String>,
}

/// `[mcp.servers.NAME.tools.TOOL]`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ToolSection {
    /// The tool's effect, overriding the server's.
    effect: Option<String>,
    /// `required` or `none`, overriding the server's approval policy.
    approval: Option<String>,
    /// How long this tool's approvals wait, overriding the server's.
    approval_timeout_seconds: Option<f64>,
}

/// The approval policy of one server and its tools, from `[mcp.servers.X]` and
/// `[mcp.servers.X.tools.Y]` (`approval = "required" | "none"`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ServerApproval {
    /// The server's own policy.
    pub(crate) required: bool,
    /// The server's timeout, when it sets one.
    pub(crate) timeout: Option<Duration>,
    /// Per remote tool: its own policy (`None`: the server's) and timeout.
    pub(crate) tools: BTreeMap<String, (Option<bool>, Option<Duration>)>,
}

fn approval(text: &str, at: &str) -> anyhow::Result<bool> {
    match text {
        "required" => Ok(true),
        "none" => Ok(false),
        other => bail!("{at}: unknown approval {other:?}: use \"required\" or \"none\""),
    }
}

fn effect(text: &str, at: &str) -> anyhow::Result<Effect> {
    Effect::parse(text).with_context(|| {
        format!("{at}: unknown effect {text:?}: use \"read_only\", \"idempotent_write\" or \"non_idempotent_write\"")
    })
}

/// `auth = { oauth = { ... } }`, checked at load with the key named.
fn oauth_settings(
    mut section: OAuthSection,
    at: &str,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<OAuthSettings> {
    let at = format!("{at} auth.oauth");
    let grant = Grant::parse(&section.grant).with_context(|| {
        format!(
            "{at}: unknown grant {:?}: use \"client_credentials\", \"authorization_code\", \"jwt_bearer\" or \"cross_app_access\"",
            section.grant
        )
    })?;
    let (assertion, identity_provider) = assertion_settings(&mut section, grant, &at, resolve)?;
    let mut settings = OAuthSettings::new(grant);
    let secret = |key: &str, name: Option<String>| -> anyhow::Result<Option<SecretName>> {
        name.map(|n| SecretName::new(n).with_context(|| format!("{at}: {key}")))
            .transpose()
    };
    settings.client_secret = secret("client_secret", section.client_secret)?;
    settings.private_key = secret("private_key", section.private_key)?;
    settings.client_id = section.client_id;
    if let Some(method) = &section.auth_method {
        settings.auth_method = Some(AuthMethod::parse(method).with_context(|| {
            format!("{at}: unknown auth_method {method:?}: use client_secret_basic, client_secret_post, private_key_jwt or none")
        })?);
    }
    if let Some(alg) = &section.signing_alg {
        settings.signing_alg = SigningAlg::parse(alg)
            .with_context(|| format!("{at}: unknown signing_alg {alg:?}: use ES256 or RS256"))?;
    }
    match settings.auth_method {
        Some(AuthMethod::PrivateKeyJwt) if settings.private_key.is_none() => {
            bail!("{at}: auth_method \"private_key_jwt\" needs private_key = \"<vault secret>\"")
        }
        Some(AuthMethod::ClientSecretBasic | AuthMethod::ClientSecretPost)
            if settings.client_secret.is_none() =>
        {
            bail!(
                "{at}: auth_method {:?} needs client_secret = \"<vault secret>\"",
                section.auth_method.unwrap_or_default()
            )
        }
        _ => {}
    }
    if grant == Grant::ClientCredentials {
        if settings.client_id.is_none() {
            bail!(
                "{at}: grant \"client_credentials\" needs client_id (and client_secret or private_key)"
            );
        }
        if settings.client_secret.is_none()
            && settings.private_key.is_none()
            && settings.auth_method != Some(AuthMethod::None)
        {
            bail!(
                "{at}: grant \"client_credentials\" needs client_secret or private_key (vault secret names)"
            );
        }
    }
    if let Some(url) = section.client_metadata_url {
        let parsed = url::Url::parse(&url).ok();
        if !parsed.is_some_and(|u| u.scheme() == "https" && u.path() != "/") {
            bail!(
                "{at}: client_metadata_url must be an https URL with a path (the Client ID Metadata Document)"
            );
        }
        settings.client_metadata_url = Some(url);
    }
    if settings.client_id.is_some()
        && settings.client_metadata_url.is_some()
        && grant == Grant::ClientCredentials
    {
        bail!("{at}: client_metadata_url goes with grant \"authorization_code\"");
    }
    if settings.client_metadata_url.is_some() && settings.assertion.is_some() {
        bail!("{at}: client_metadata_url goes with grant \"authorization_code\"");
    }
    settings.scopes = section.scopes;
    settings.dpop = section.dpop;
    if grant == Grant::CrossAppAccess && settings.client_id.is_none() {
        bail!(
            "{at}: grant \"cross_app_access\" needs client_id (the client the ID-JAG is issued to)"
        );
    }
    settings.assertion = assertion;
    settings.identity_provider = identity_provider;
    Ok(settings)
}

/// The keys of the assertion grants: where the JWT comes from (a file or a command) and,
/// for `cross_app_access`, the identity provider. Each key is refused with other grants.
fn assertion_settings(
    section: &mut OAuthSection,
    grant: Grant,
    at: &str,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<(Option<AssertionSource>, Option<IdentityProvider>)> {
    let (file_key, command_key, file, command) = match grant {
        Grant::JwtBearer => (
            "assertion_file",
            "assertion_command",
            section.assertion_file.take(),
            section.assertion_command.take(),
        ),
        _ => (
            "id_token_file",
            "id_token_command",
            section.id_token_file.take(),
            section.id_token_command.take(),
        ),
    };
    refuse_stray_assertion_keys(section, grant, at)?;
    if !matches!(grant, Grant::JwtBearer | Grant::CrossAppAccess) {
        if file.is_some() || command.is_some() {
            bail!("{at}: {file_key} and {command_key} go with grant \"cross_app_access\"");
        }
        return Ok((None, None));
    }
    let source = match (file, command) {
        (Some(path), None) => AssertionSource::File(resolve(path)),
        (None, Some(argv)) if argv.first().is_some_and(|p| !p.trim().is_empty()) => {
            AssertionSource::Command(argv)
        }
        (None, Some(_)) => {
            bail!("{at}: {command_key} needs a program: [\"PROGRAM\", \"ARG\", ...]")
        }
        (Some(_), Some(_)) => bail!("{at}: give {file_key} or {command_key}, not both"),
        (None, None) => bail!(
            "{at}: grant \"{}\" needs {file_key} = \"PATH\" or {command_key} = [\"PROGRAM\", ...]",
            grant.as_str()
        ),
    };
    if grant == Grant::JwtBearer {
        return Ok((Some(source), None));
    }
    let (Some(token_endpoint), Some(client_id)) = (
        section.idp_token_endpoint.take(),
        section.idp_client_id.take(),
    ) else {
        bail!(
            "{at}: grant \"cross_app_access\" needs idp_token_endpoint (the identity provider's token endpoint) and idp_client_id"
        );
    };
    http_url(&format!("{at} idp_token_endpoint"), &token_endpoint)?;
    let client_secret = section
        .idp_client_secret
        .take()
        .map(|n| SecretName::new(n).with_context(|| format!("{at}: idp_client_secret")))
        .transpose()?;
    Ok((
        Some(source),
        Some(IdentityProvider {
            token_endpoint,
            client_id,
            client_secret,
        }),
    ))
}

/// Refuses an assertion key set with a grant it does not belong to, naming the grant it
/// goes with. Called after the grant's own keys were taken out of `section`.
fn refuse_stray_assertion_keys(
    section: &OAuthSection,
    grant: Grant,
    at: &str,
) -> anyhow::Result<()> {
    let stray = [
        (
            "assertion_file",
            section.assertion_file.is_some(),
            "jwt_bearer",
        ),
        (
            "assertion_command",
            section.assertion_command.is_some(),
            "jwt_bearer",
        ),
        (
            "id_token_file",
            section.id_token_file.is_some(),
            "cross_app_access",
        ),
        (
            "id_token_command",
            section.id_token_command.is_some(),
            "cross_app_access",
        ),
        (
            "idp_token_endpoint",
            section.idp_token_endpoint.is_some() && grant != Grant::CrossAppAccess,
            "cross_app_access",
        ),
        (
            "idp_client_id",
            section.idp_client_id.is_some() && grant != Grant::CrossAppAccess,
            "cross_app_access",
        ),
        (
            "idp_client_secret",
            section.idp_client_secret.is_some() && grant != Grant::CrossAppAccess,
            "cross_app_access",
        ),
    ];
    if let Some((key, _, owner)) = stray.iter().find(|(_, set, _)| *set) {
        bail!("{at}: {key} goes with grant \"{owner}\"");
    }
    Ok(())
}

/// A server from `[mcp.servers.NAME]`, checked so that its tools' local names
/// stay unique (`<name>__<tool>`) and its effects are the operator's.
fn mcp_server(
    name: &str,
    section: ServerSection,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<(ServerConfig, ServerApproval)> {
    let at = format!("[mcp.servers.{name}]");
    let valid_name = !name.is_empty()
        && name.len() <= 32
        && !name.contains("__")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid_name {
        bail!(
            "{at}: a server name is 1 to 32 characters of A-Z a-z 0-9 _ - without \"__\" (it prefixes tool names)"
        );
    }
    if section.url.trim().is_empty() {
        bail!("mcp.servers.{name}.url is empty: give the server's Streamable HTTP endpoint");
    }
    http_url(&format!("mcp.servers.{name}.url"), &section.url)?;
    let mut oauth = None;
    let auth = match section.auth {
        None => None,
        Some(AuthSection {
            oauth: Some(settings),
            secret,
            placement,
            header,
            prefix,
            param,
        }) => {
            if secret.is_some()
                || placement.is_some()
                || header.is_some()
                || prefix.is_some()
                || param.is_some()
            {
                bail!(
                    "{at}: auth.oauth stands alone: remove secret, placement, header, prefix and param (the vault places the OAuth token)"
                );
            }
            oauth = Some(oauth_settings(settings, &at, resolve)?);
            None
        }
        Some(auth) => {
            let (Some(secret), Some(placement)) = (auth.secret, auth.placement) else {
                bail!(
                    "{at}: auth needs secret = \"NAME\" and placement = \"bearer\" (or basic, header, query), or oauth = {{ grant = ... }}"
                );
            };
            let placement = match (placement.as_str(), auth.header, auth.param) {
                ("bearer", None, None) => Placement::Bearer,
                ("basic", None, None) => Placement::Basic,
                ("header", Some(name), None) => Placement::Header {
                    name,
                    prefix: auth.prefix.clone(),
                },
                ("query", None, Some(name)) => Placement::Query { name },
                ("header", None, _) => {
                    bail!("{at}: auth placement \"header\" needs header = \"Header-Name\"")
                }
                ("query", _, None) => {
                    bail!("{at}: auth placement \"query\" needs param = \"name\"")
                }
                (other, _, _) if !["bearer", "basic", "header", "query"].contains(&other) => {
                    bail!(
                        "{at}: unknown auth placement {other:?}: use bearer, basic, header or query"
                    )
                }
                _ => bail!("{at}: header goes with placement \"header\" and param with \"query\""),
            };
            if auth.prefix.is_some() && !matches!(placement, Placement::Header { .. }) {
                bail!("{at}: prefix goes with placement \"header\"");
            }
            Some(Credential {
                secret: SecretName::new(secret).with_context(|| format!("{at}: auth secret"))?,
                placement,
            })
        }
    };
    let mut server = ServerConfig::new(name, section.url);
    if oauth.is_some() && url::Url::parse(&server.url).is_err() {
        bail!("{at}: url is not a URL, and OAuth needs one to find the authorization server");
    }
    server.auth = auth;
    server.oauth = oauth;
    if let Some(text) = section.effect {
        server.effect = effect(&text, &format!("mcp.servers.{name}.effect"))?;
    }
    if let Some(timeout) = section.timeout_seconds {
        server.timeout = seconds(&format!("{at} timeout_seconds"), timeout)?;
        // M3: the budget is the whole operation's; below the minimum a handshake and a
        // call cannot both fit, so it is refused here rather than at every call.
        if server.timeout < runwarden_mcp::MIN_BUDGET {
            bail!(
                "{at} timeout_seconds = {timeout} is too small: it is the budget of a whole operation (the handshake and the call), and must be at least {} s",
                runwarden_mcp::MIN_BUDGET.as_secs()
            );
        }
    }
    if let Some(limit) = section.max_response_bytes {
        let ceiling = runwarden_mcp::MAX_RESPONSE_BYTES_CEILING;
        if limit < 1024 || limit > ceiling as u64 {
            bail!(
                "{at} max_response_bytes = {limit} is out of range: give a number of bytes from 1024 to {ceiling} (the default is {})",
                runwarden_mcp::DEFAULT_MAX_RESPONSE_BYTES
            );
        }
        server.max_response_bytes = limit as usize;
    }
    let mut policy = ServerApproval {
        required: section
            .approval
            .as_deref()
            .map(|a| approval(a, &at))
            .transpose()?
            .unwrap_or(false),
        timeout: section
            .approval_timeout_seconds
            .map(|s| seconds(&format!("{at} approval_timeout_seconds"), s))
            .transpose()?,
        tools: BTreeMap::new(),
    };
    if let Some(text) = section.elicitation {
        // M14: "operator" hands a server's questions to a person; anything else is a typo.
        server.elicitation = ElicitationPolicy::parse(&text).with_context(|| {
            format!(
                "{at}: unknown elicitation {text:?}: use \"decline\" (the default) or \"operator\""
            )
        })?;
    }
    if let Some(extends) = section.progress_extends_deadline {
        server.progress_extends_deadline = extends;
    }
    if let Some(text) = section.protocol {
        // M19: "auto" negotiates 2026-07-28 when served; "2025-11-25" only handshakes.
        server.protocol = runwarden_mcp::ProtocolPolicy::parse(&text).with_context(|| {
            format!("{at}: unknown protocol {text:?}: use \"auto\" (the default) or \"2025-11-25\"")
        })?;
    }
    for (tool, declared) in section.tools {
        let at = format!("[mcp.servers.{name}.tools.{tool}]");
        if let Some(text) = &declared.effect {
            let key = format!("mcp.servers.{name}.tools.{tool}.effect");
            server.tools.insert(tool.clone(), effect(text, &key)?);
        }
        let required = declared
            .approval
            .as_deref()
            .map(|a| approval(a, &at))
            .transpose()?;
        let timeout = declared
            .approval_timeout_seconds
            .map(|s| seconds(&format!("{at} approval_timeout_seconds"), s))
            .transpose()?;
        if required.is_some() || timeout.is_some() {
            policy.tools.insert(tool, (required, timeout));
        }
    }
    Ok((server, policy))
}

/// `[store]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct StoreSection {
    /// The SQLite file. Default `<data_dir>/runwarden.db`. Env: `RUNWARDEN_SQLITE_PATH`.
    sqlite_path: Option<PathBuf>,
    /// `sqlite:PATH` or `postgres://USER:PASSWORD@HOST/DB` (many nodes). Env: `RUNWARDEN_DATABASE_URL`.
    url: Option<String>,
    /// PostgreSQL: the server cancels a statement that runs longer (`statement_timeout`), and ends a session idle inside a transaction as long (`idle_in_transaction_session_timeout`). Default `10`.
    statement_timeout_seconds: Option<f64>,
    /// PostgreSQL: the client's bound on a whole store call (pool wait, statements, commit); past it the call fails as retryable and its connection is dropped. Default `20`.
    call_timeout_seconds: Option<f64>,
    /// PostgreSQL: how long a call waits for a free pooled connection. Default `5`.
    pool_wait_seconds: Option<f64>,
}

/// The PostgreSQL bounds of `[store]`, the defaults where a key is absent.
fn pg_options(section: &StoreSection) -> anyhow::Result<PgOptions> {
    let mut options = PgOptions::default();
    if let Some(value) = section.statement_timeout_seconds {
        options.statement_timeout = seconds("[store] statement_timeout_seconds", value)?;
        options.idle_in_transaction_timeout = options.statement_timeout;
    }
    if let Some(value) = section.call_timeout_seconds {
        options.call_timeout = seconds("[store] call_timeout_seconds", value)?;
    }
    if let Some(value) = section.pool_wait_seconds {
        options.pool_wait = seconds("[store] pool_wait_seconds", value)?;
    }
    Ok(options)
}

/// `[vault]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct VaultSection {
    /// The master key file (mode 0600). Default `<data_dir>/master.key`. Env: `RUNWARDEN_MASTER_KEY_FILE`; `RUNWARDEN_MASTER_KEY` gives the key itself as 64 hex characters.
    master_key_file: Option<PathBuf>,
    /// `xchacha20poly1305` (the default) or `aes256gcm`, for new secrets.
    algorithm: Option<String>,
    /// The audit chain's witness outside the database. Default `<data_dir>/audit.anchor`. Env: `RUNWARDEN_AUDIT_ANCHOR_FILE`.
    audit_anchor_file: Option<PathBuf>,
}

/// `[audit]`.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct AuditSection {
    /// A file on another path where every advance of the audit anchor is appended, opened append-only; `audit verify --witness` checks the log against it. Default: none.
    witness: Option<PathBuf>,
}

/// `[egress]`.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct EgressSection {
    /// Hosts, addresses and CIDRs outbound calls may reach besides public addresses. Env: `RUNWARDEN_EGRESS_ALLOW` (comma-separated).
    #[serde(default)]
    allow: Vec<String>,
    /// The bound of a TCP and TLS connect. Default `10`.
    #[serde(default = "default_connect_timeout")]
    connect_timeout_seconds: f64,
    /// The bound of a call when its caller sets none. Default `30`.
    #[serde(default = "default_timeout")]
    timeout_seconds: f64,
}

impl Default for EgressSection {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            connect_timeout_seconds: default_connect_timeout(),
            timeout_seconds: default_timeout(),
        }
    }
}

fn default_connect_timeout() -> f64 {
    10.0
}

fn default_timeout() -> f64 {
    30.0
}

/// The resolved configuration: every path absolute, every override applied.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The file this came from (it may not exist yet).
    pub(crate) path: PathBuf,
    pub(crate) data_dir: PathBuf,
    /// `[store] url`: SQLite (the default) or PostgreSQL.
    pub(crate) store: StoreUrl,
    /// `[store]`'s bounds on every PostgreSQL call.
    pub(crate) pg_options: PgOptions,
    pub(crate) master_key_file: PathBuf,
    /// `[vault] audit_anchor_file`: the audit log's witness outside the database.
    pub(crate) audit_anchor_file: PathBuf,
    /// `[audit] witness`: the external witness, appended to at every anchor advance.
    pub(crate) audit_witness: Option<PathBuf>,
    pub(crate) algorithm: Algorithm,
    pub(crate) egress_allow: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) timeout: Duration,
    /// MCP servers by name.
    pub(crate) mcp_servers: BTreeMap<String, ServerConfig>,
    /// The approval policy of each server, by name.
    pub(crate) approvals: BTreeMap<String, ServerApproval>,
    /// Agents by name.
    pub(crate) agents: BTreeMap<String, AgentConfig>,
    /// Workers' settings.
    pub(crate) worker: WorkerSettings,
    /// The API server's limits.
    pub(crate) serve: ServeSettings,
    /// `[client] server`: the runwarden server the CLI talks to by default.
    pub(crate) client_server: Option<String>,
    /// `[client] token_file`: where the CLI's API token is kept (mode 0600).
    pub(crate) client_token_file: Option<PathBuf>,
    /// `[metrics]`.
    pub(crate) metrics: MetricsSettings,
    /// `[telemetry] record_arguments`: tool call arguments on their spans.
    pub(crate) record_arguments: bool,
    /// `[console]`.
    pub(crate) console: ConsoleSettings,
}

/// Where the data lives, first match wins: `$RUNWARDEN_DATABASE_URL`,
/// `$RUNWARDEN_SQLITE_PATH`, `[store] url` or `[store] sqlite_path` (not both), and
/// `<data_dir>/runwarden.db`.
fn store_url(
    section: StoreSection,
    data_dir: &Path,
    resolve: &impl Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<StoreUrl> {
    if let Some(text) = env(DATABASE_URL_ENV) {
        return StoreUrl::parse(&text, resolve).with_context(|| format!("in ${DATABASE_URL_ENV}"));
    }
    if let Some(path) = env("RUNWARDEN_SQLITE_PATH") {
        return Ok(StoreUrl::Sqlite(resolve(PathBuf::from(path))));
    }
    match (section.url, section.sqlite_path) {
        (Some(_), Some(_)) => {
            bail!(
                "[store] has both url and sqlite_path: keep one (url = \"sqlite:PATH\" says the same as sqlite_path = \"PATH\")"
            )
        }
        (Some(text), None) => StoreUrl::parse(&text, resolve).context("in [store] url"),
        (None, Some(path)) => Ok(StoreUrl::Sqlite(resolve(path))),
        (None, None) => Ok(StoreUrl::Sqlite(data_dir.join("runwarden.db"))),
    }
}

/// True when `$RUNWARDEN_MASTER_KEY` supplies the key. An empty value does not count, the
/// same rule [`Config::master_key`] applies, so every command agrees on where the key is.
pub(crate) fn master_key_from_env() -> bool {
    env(MASTER_KEY_ENV).is_some()
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn seconds(name: &str, value: f64) -> anyhow::Result<Duration> {
    if !(value.is_finite() && value > 0.0 && value <= 3600.0) {
        bail!("{name} must be a number of seconds between 0 and 3600, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

impl Config {
    /// Where the config file is: `--config`, else `$RUNWARDEN_CONFIG`, else `./runwarden.toml`.
    pub(crate) fn locate(flag: Option<&Path>) -> PathBuf {
        flag.map(Path::to_path_buf)
            .or_else(|| env(CONFIG_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("runwarden.toml"))
    }

    /// The file the operator named with `--config` or `$RUNWARDEN_CONFIG`, if any. A named
    /// file must exist (a typo is not a silent default); the default `./runwarden.toml`
    /// may be absent.
    pub(crate) fn named(flag: Option<&Path>) -> Option<PathBuf> {
        flag.map(Path::to_path_buf)
            .or_else(|| env(CONFIG_ENV).map(PathBuf::from))
    }

    /// Loads the file if it exists (defaults otherwise) and applies the environment.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let file: FileConfig = match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}{e}", key_of_error(&text, &e)))
                .with_context(|| format!("while reading the configuration {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileConfig::default(),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("while reading the configuration {}", path.display())
                });
            }
        };
        // A value the parser accepted but a check refuses names the file too, as a
        // parse error does.
        Self::from_file(path, file)
            .with_context(|| format!("while reading the configuration {}", path.display()))
    }

    /// The checked configuration from the parsed `file` at `path`, with the environment
    /// applied.
    fn from_file(path: &Path, file: FileConfig) -> anyhow::Result<Self> {
        // The process already read these with `LogFormat::peek` and
        // `peek_otlp_endpoint`; a bad value is reported here.
        if let Some(format) = &file.log.format {
            LogFormat::parse("[log] format", format)?;
        }
        if let Some(endpoint) = &file.telemetry.otlp_endpoint {
            otlp_endpoint(endpoint)?;
        }
        let base = std::path::absolute(path)?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };

        let data_dir = resolve(
            env("RUNWARDEN_DATA_DIR")
                .map(PathBuf::from)
                .or(file.data_dir)
                .unwrap_or_else(|| ".runwarden".into()),
        );
        let pg_options = pg_options(&file.store)?;
        let store = store_url(file.store, &data_dir, &resolve)?;
        let master_key_file = env("RUNWARDEN_MASTER_KEY_FILE")
            .map(PathBuf::from)
            .or(file.vault.master_key_file)
            .map(resolve)
            .unwrap_or_else(|| data_dir.join("master.key"));
        let audit_anchor_file = env("RUNWARDEN_AUDIT_ANCHOR_FILE")
            .map(PathBuf::from)
            .or(file.vault.audit_anchor_file)
            .map(resolve)
            .unwrap_or_else(|| data_dir.join("audit.anchor"));
        let audit_witness = file.audit.witness.map(resolve);
        let algorithm_name = file
            .vault
            .algorithm
            .unwrap_or_else(|| "xchacha20poly1305".into());
        let algorithm = Algorithm::parse(&algorithm_name)
            .with_context(|| format!("unknown [vault] algorithm {algorithm_name:?}: use \"xchacha20poly1305\" or \"aes256gcm\""))?;
        let egress_allow = match env("RUNWARDEN_EGRESS_ALLOW") {
            Some(list) => list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            None => file.egress.allow,
        };
        let mut mcp_servers = BTreeMap::new();
        let mut approvals = BTreeMap::new();
        for (name, section) in file.mcp.servers {
            let (server, policy) = mcp_server(&name, section, &resolve)?;
            mcp_servers.insert(name.clone(), server);
            approvals.insert(name, policy);
        }
        Ok(Self {
            path: path.to_path_buf(),
            mcp_servers,
            approvals,
            data_dir,
            store,
            pg_options,
            master_key_file,
            audit_anchor_file,
            audit_witness,
            algorithm,
            egress_allow,
            connect_timeout: seconds(
                "[egress] connect_timeout_seconds",
                file.egress.connect_timeout_seconds,
            )?,
            timeout: seconds("[egress] timeout_seconds", file.egress.timeout_seconds)?,
            agents: file
                .agents
                .into_iter()
                .map(|(name, section)| Ok((name.clone(), agent(&name, section, &resolve)?)))
                .collect::<anyhow::Result<_>>()?,
            worker: worker_settings(file.worker)?,
            serve: serve_settings(file.serve, &resolve)?,
            client_server: match file.client.server {
                Some(url) => {
                    http_url("client.server", &url)?;
                    Some(url)
                }
                None => None,
            },
            client_token_file: file.client.token_file.map(&resolve),
            metrics: MetricsSettings {
                require_token: file.metrics.require_token.unwrap_or(true),
                listen: file.metrics.listen,
            },
            record_arguments: file.telemetry.record_arguments.unwrap_or(false),
            console: console_settings(file.console)?,
        })
    }

    /// The CLI's API token: `$RUNWARDEN_TOKEN`, else the `[client] token_file`.
    pub(crate) fn client_token(&self) -> anyhow::Result<Option<String>> {
        if let Some(token) = env(crate::client::TOKEN_ENV) {
            return Ok(Some(token.trim().to_string()));
        }
        let Some(path) = &self.client_token_file else {
            return Ok(None);
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .with_context(|| format!("while reading [client] token_file {}", path.display()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                bail!(
                    "the token file {} may be read by other users: chmod 600 it",
                    path.display()
                );
            }
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("while reading [client] token_file {}", path.display()))?;
        Ok(Some(text.trim().to_string()))
    }

    /// One configured agent, or an error listing the configured ones.
    pub(crate) fn agent(&self, name: &str) -> anyhow::Result<&AgentConfig> {
        self.agents.get(name).with_context(|| {
            let known: Vec<&str> = self.agents.keys().map(String::as_str).collect();
            if known.is_empty() {
                format!(
                    "no agent named {name:?}: declare it as [agents.{name}] in {}",
                    self.path.display()
                )
            } else {
                format!(
                    "no agent named {name:?}: the configured ones are {}",
                    known.join(", ")
                )
            }
        })
    }

    /// Whether a call of `remote` on `server` by `agent` (local name `local`) waits for
    /// an operator, and how long: the tool's own policy beats its server's, and an agent's
    /// `approve` patterns add approvals (never remove them). The most specific timeout
    /// wins; the default is 24 hours.
    pub(crate) fn approval_of(
        &self,
        agent: &AgentConfig,
        server: &str,
        remote: &str,
        local: &str,
    ) -> Option<Duration> {
        let policy = self.approvals.get(server).cloned().unwrap_or_default();
        let (tool_required, tool_timeout) = policy.tools.get(remote).copied().unwrap_or_default();
        let by_config = tool_required.unwrap_or(policy.required);
        let by_agent = agent
            .approve
            .iter()
            .any(|p| runwarden_runtime::pattern_matches(p, local));
        if !(by_config || by_agent) {
            return None;
        }
        let agent_timeout = by_agent.then_some(agent.approval_timeout).flatten();
        Some(
            agent_timeout
                .or(tool_timeout)
                .or(policy.timeout)
                .unwrap_or(runwarden_runtime::decision::DEFAULT_APPROVAL_TIMEOUT),
        )
    }

    /// One configured MCP server, or an error listing the configured ones.
    pub(crate) fn mcp_server(&self, name: &str) -> anyhow::Result<&ServerConfig> {
        self.mcp_servers.get(name).with_context(|| {
            let known: Vec<&str> = self.mcp_servers.keys().map(String::as_str).collect();
            if known.is_empty() {
                format!(
                    "no MCP server named {name:?}: declare it as [mcp.servers.{name}] in {}",
                    self.path.display()
                )
            } else {
                format!(
                    "no MCP server named {name:?}: the configured ones are {}",
                    known.join(", ")
                )
            }
        })
    }

    /// The master key from `$RUNWARDEN_MASTER_KEY` or the key file. Never creates one.
    pub(crate) fn master_key(&self) -> anyhow::Result<MasterKey> {
        match env(MASTER_KEY_ENV) {
            Some(value) => Ok(MasterKey::from_env_value(&value, MASTER_KEY_ENV)?),
            None => Ok(MasterKey::from_file(&self.master_key_file)?),
        }
    }

    /// The egress client's settings.
    pub(crate) fn egress(&self) -> anyhow::Result<EgressConfig> {
        Ok(EgressConfig {
            policy: EgressPolicy::new(&self.egress_allow)?,
            connect_timeout: self.connect_timeout,
            default_timeout: self.timeout,
            tick: MAX_TICK,
            backstop_tick: runwarden_vault::DEFAULT_BACKSTOP_TICK,
        })
    }
}

/// Every environment variable runwarden reads, with what it does (the reference's second
/// table; a test checks that the sources read no other).
#[cfg(test)]
pub(crate) const ENVIRONMENT: [(&str, &str); 12] = [
    (
        "RUNWARDEN_CONFIG",
        "The configuration file, when `--config` is not given. Default `./runwarden.toml`.",
    ),
    ("RUNWARDEN_DATA_DIR", "Overrides `data_dir`."),
    (
        "RUNWARDEN_DATABASE_URL",
        "Overrides `[store] url`: `sqlite:PATH` or `postgres://...`.",
    ),
    ("RUNWARDEN_SQLITE_PATH", "Overrides `[store] sqlite_path`."),
    (
        "RUNWARDEN_MASTER_KEY_FILE",
        "Overrides `[vault] master_key_file`.",
    ),
    (
        "RUNWARDEN_MASTER_KEY",
        "The master key itself, as 64 hex characters, instead of the key file.",
    ),
    (
        "RUNWARDEN_AUDIT_ANCHOR_FILE",
        "Overrides `[vault] audit_anchor_file`.",
    ),
    (
        "RUNWARDEN_EGRESS_ALLOW",
        "Overrides `[egress] allow`: comma-separated hosts, addresses and CIDRs.",
    ),
    (
        "RUNWARDEN_LOG",
        "The log filter (`info`, `debug`, `runwarden_vault=trace`). Default `warn`.",
    ),
    (
        "RUNWARDEN_LOG_FORMAT",
        "`text` or `json`, like `--log-format`; overrides `[log] format`.",
    ),
    (
        "RUNWARDEN_SERVER",
        "The server the CLI talks to, like `--server`; overrides `[client] server`.",
    ),
    (
        "RUNWARDEN_TOKEN",
        "The CLI's API token; overrides `[client] token_file`.",
    ),
];

/// docs/configuration.md: every key of the file, generated from [`FileConfig`]'s types and
/// their doc comments, then every environment variable. An empty variable counts as unset.
/// Written by a test (see `the_configuration_reference_is_current`).
#[cfg(test)]
pub(crate) fn reference() -> String {
    use serde_json::Value;
    let root = serde_json::to_value(schemars::schema_for!(FileConfig)).unwrap_or(Value::Null);
    let defs = root.get("$defs").cloned().unwrap_or(Value::Null);
    let resolve = |schema: &Value| -> Value {
        // `Option<T>` is `anyOf: [T, null]`; a section is a `$ref` into `$defs`.
        let schema = schema
            .get("anyOf")
            .and_then(Value::as_array)
            .and_then(|all| {
                all.iter()
                    .find(|s| s.get("type") != Some(&Value::from("null")))
            })
            .unwrap_or(schema);
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => defs
                .get(r.trim_start_matches("#/$defs/"))
                .cloned()
                .unwrap_or(Value::Null),
            None => schema.clone(),
        }
    };
    fn kind(schema: &Value) -> String {
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(all)) => all.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
        match types.as_slice() {
            ["array"] => format!(
                "list of {}",
                schema.get("items").map(kind).unwrap_or_default()
            ),
            ["integer"] => "integer".into(),
            [one] => (*one).to_string(),
            _ => "table".into(),
        }
    }
    fn one_line(text: &str) -> String {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the configuration file's types by `cargo test -p runwarden config::tests::\
         the_configuration_reference_is_current` (set `RUNWARDEN_BLESS=1` to rewrite it); do not \
         edit by hand. The file is `--config PATH`, else `$RUNWARDEN_CONFIG`, else \
         `./runwarden.toml`. Unknown keys are errors; relative paths are relative to the file. \
         `runwarden init` writes a commented example.\n",
    );
    // Sections are written breadth-first so a section comes before its subsections.
    let mut queue: std::collections::VecDeque<(String, Value)> = Default::default();
    queue.push_back((String::new(), root.clone()));
    while let Some((path, schema)) = queue.pop_front() {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            continue;
        };
        let mut rows = Vec::new();
        for (key, field) in properties {
            let target = resolve(field);
            let doc = field
                .get("description")
                .or_else(|| target.get("description"))
                .and_then(Value::as_str)
                .map(one_line)
                .unwrap_or_default();
            let child = |name: &str| {
                if path.is_empty() {
                    name.to_string()
                } else {
                    format!("{path}.{name}")
                }
            };
            if target.get("properties").is_some() {
                let mut described = target.clone();
                if let Some(obj) = described.as_object_mut()
                    && !doc.is_empty()
                {
                    obj.insert("description".into(), Value::from(doc.clone()));
                }
                queue.push_back((child(key), described));
            } else if let Some(values) =
                target.get("additionalProperties").filter(|v| v.is_object())
            {
                let entry = resolve(values);
                let name = if key == "tools" { "TOOL" } else { "NAME" };
                let mut described = entry.clone();
                if let Some(obj) = described.as_object_mut() {
                    obj.insert("description".into(), Value::from(doc.clone()));
                }
                queue.push_back((child(&format!("{key}.{name}")), described));
            } else {
                rows.push(format!("| `{key}` | {} | {doc} |", kind(&target)));
            }
        }
        if rows.is_empty() && !path.is_empty() {
            let doc = schema
                .get("description")
                .and_then(Value::as_str)
                .map(one_line);
            out.push_str(&format!("\n## `[{path}]`\n\n{}\n", doc.unwrap_or_default()));
            continue;
        }
        let title = if path.is_empty() {
            "Top level".to_string()
        } else {
            format!("`[{path}]`")
        };
        out.push_str(&format!("\n## {title}\n\n"));
        if let Some(doc) = schema
            .get("description")
            .and_then(Value::as_str)
            .filter(|_| !path.is_empty())
        {
            out.push_str(&format!("{}\n\n", one_line(doc)));
        }
        out.push_str("| key | type | meaning |\n| --- | --- | --- |\n");
        for row in rows {
            out.push_str(&row);
            out.push('\n');
        }
    }
    out.push_str("\n## Environment\n\nThe environment overrides the file; an empty variable counts as unset.\n\n| variable | meaning |\n| --- | --- |\n");
    for (name, meaning) in ENVIRONMENT {
        out.push_str(&format!("| `{name}` | {meaning} |\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_agents_get_a_default_max_tokens_budgets_and_anthropic_needs_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let text = format!(
            "{TEMPLATE}\n[agents.local]\nprovider = \"anthropic\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmax_tool_calls = 3\nmax_wall_seconds = 60\n\n[agents.cut]\nprovider = \"openai\"\nmodel = \"m\"\nmax_tokens = 64\n"
        );
        std::fs::write(&path, text).unwrap();
        let config = Config::load(&path).unwrap();
        let local = config.agent("local").unwrap();
        // L5: a server's own default may be unlimited, so an agent always sends one.
        assert_eq!(local.provider.max_tokens(), Some(DEFAULT_MAX_TOKENS));
        assert!(matches!(
            &local.provider,
            ProviderConfig::Anthropic { api_key: None, .. }
        ));
        assert_eq!(local.budgets.max_tool_calls, Some(3));
        assert_eq!(local.budgets.max_wall_seconds, Some(60));
        assert_eq!(local.budgets.max_output_tokens_total, None);
        assert_eq!(config.agent("cut").unwrap().provider.max_tokens(), Some(64));
    }

    #[test]
    fn the_configuration_reference_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
        let generated = reference();
        if std::env::var_os("RUNWARDEN_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == generated,
            "docs/configuration.md is not what the configuration types say; run \
             `RUNWARDEN_BLESS=1 cargo test -p runwarden config::tests::the_configuration_reference_is_current` \
             and commit the file"
        );
        for key in [
            "`data_dir`",
            "## `[agents.NAME]`",
            "## `[mcp.servers.NAME.tools.TOOL]`",
            "`tls_cert`",
            "`status_refresh_seconds`",
        ] {
            assert!(generated.contains(key), "{key} in\n{generated}");
        }
    }

    #[test]
    fn every_environment_variable_the_sources_read_is_in_the_reference() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut read = std::collections::BTreeSet::new();
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for (i, _) in text.match_indices("\"RUNWARDEN_") {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                        .collect();
                    read.insert(name);
                }
            }
        }
        let documented: std::collections::BTreeSet<String> =
            ENVIRONMENT.iter().map(|(n, _)| n.to_string()).collect();
        // Test-only variables of the test support code are not the program's.
        read.retain(|n| {
            n != "RUNWARDEN_" && !n.starts_with("RUNWARDEN_TEST") && n != "RUNWARDEN_BLESS"
        });
        assert_eq!(read, documented);
    }

    #[test]
    fn a_servers_elicitation_policy_and_progress_extension_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let load = |server: &str| {
            std::fs::write(
                &path,
                format!("{TEMPLATE}\n[mcp.servers.s]\nurl = \"http://x/mcp\"\n{server}"),
            )
            .unwrap();
            Config::load(&path)
        };
        let defaults = load("").unwrap();
        let s = defaults.mcp_server("s").unwrap();
        // M14, M15: decline and no extension unless the operator says otherwise.
        assert_eq!(s.elicitation, ElicitationPolicy::Decline);
        assert!(!s.progress_extends_deadline);
        let chosen = load("elicitation = \"operator\"\nprogress_extends_deadline = true").unwrap();
        let s = chosen.mcp_server("s").unwrap();
        assert_eq!(s.elicitation, ElicitationPolicy::Operator);
        assert!(s.progress_extends_deadline);
        // M19: the 2026-07-28 revision is negotiated unless the operator pins the handshake.
        assert_eq!(s.protocol, runwarden_mcp::ProtocolPolicy::Auto);
        let pinned = load("protocol = \"2025-11-25\"").unwrap();
        assert_eq!(
            pinned.mcp_server("s").unwrap().protocol,
            runwarden_mcp::ProtocolPolicy::Handshake
        );
        assert!(format!("{:#}", load("protocol = \"2026\"").unwrap_err()).contains("\"auto\""));
        let error = format!("{:#}", load("elicitation = \"ask\"").unwrap_err());
        assert!(
            error.contains("[mcp.servers.s]")
                && error.contains("\"decline\"")
                && error.contains("\"operator\""),
            "{error}"
        );
    }

    #[test]
    fn the_anthropic_version_header_is_configurable_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let load = |agent: &str| {
            std::fs::write(&path, format!("{TEMPLATE}\n[agents.a]\n{agent}")).unwrap();
            Config::load(&path)
        };
        let version = |config: &Config| match &config.agent("a").unwrap().provider {
            ProviderConfig::Anthropic { version, .. } => version.clone(),
            other => panic!("{other:?}"),
        };
        let anthropic = "provider = \"anthropic\"\nmodel = \"m\"\n";
        assert_eq!(version(&load(anthropic).unwrap()), "2023-06-01");
        let newer = load(&format!("{anthropic}anthropic_version = \"2099-01-01\"\n")).unwrap();
        assert_eq!(version(&newer), "2099-01-01");
        let injected = load(&format!(
            "{anthropic}anthropic_version = \"2023-06-01\\r\\nX-Evil: 1\"\n"
        ))
        .unwrap_err();
        assert!(
            format!("{injected:#}").contains("anthropic_version must be a version like"),
            "{injected:#}"
        );
        let elsewhere =
            load("provider = \"openai\"\nmodel = \"m\"\nanthropic_version = \"x\"\n").unwrap_err();
        assert!(
            format!("{elsewhere:#}").contains("applies to provider = \"anthropic\" only"),
            "{elsewhere:#}"
        );
    }

    #[test]
    fn the_template_parses_and_paths_are_relative_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(&path, TEMPLATE).unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.data_dir, dir.path().join(".runwarden"));
        assert_eq!(
            config.store,
            StoreUrl::Sqlite(dir.path().join(".runwarden/runwarden.db"))
        );
        assert_eq!(
            config.master_key_file,
            dir.path().join(".runwarden/master.key")
        );
        assert_eq!(config.timeout, Duration::from_secs(30));
        assert_eq!(
            config.audit_anchor_file,
            dir.path().join(".runwarden/audit.anchor"),
            "V7: the anchor defaults to <data_dir>/audit.anchor"
        );
    }

    #[test]
    fn the_status_refresh_defaults_to_a_second_and_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(&path, TEMPLATE).unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(
            config.worker.status_refresh,
            Duration::from_secs(1),
            "R6: at most one read per second per call by default"
        );
        std::fs::write(&path, "[worker]\nstatus_refresh_seconds = 60\n").unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config.worker.status_refresh, Duration::from_secs(60));
        for bad in ["0.01", "61"] {
            std::fs::write(&path, format!("[worker]\nstatus_refresh_seconds = {bad}\n")).unwrap();
            let error = format!("{:#}", Config::load(&path).unwrap_err());
            assert!(
                error.contains("status_refresh_seconds must be between 0.05 and 60"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_audit_anchor_file_is_configurable_relative_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(
            &path,
            "[vault]\naudit_anchor_file = \"witness/audit.anchor\"\n",
        )
        .unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(
            config.audit_anchor_file,
            dir.path().join("witness/audit.anchor")
        );
    }

    #[test]
    fn an_unknown_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(&path, "[egress]\nallowed = []\n").unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains("allowed"), "{err}");
    }

    #[test]
    fn an_mcp_server_is_read_with_its_auth_effects_and_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let text = r#"
[mcp.servers.tickets]
url = "https://mcp.example.com/mcp"
auth = { secret = "tickets-token", placement = "header", header = "X-Api-Key", prefix = "Key " }
effect = "idempotent_write"
timeout_seconds = 5
[mcp.servers.tickets.tools.search]
effect = "read_only"
"#;
        std::fs::write(&path, text).unwrap();
        let config = Config::load(&path).unwrap();
        let server = config.mcp_server("tickets").unwrap();
        assert_eq!(server.timeout, Duration::from_secs(5));
        assert_eq!(server.effect_of("search"), Effect::ReadOnly);
        assert_eq!(server.effect_of("create"), Effect::IdempotentWrite);
        let auth = server.auth.as_ref().unwrap();
        assert_eq!(auth.secret.as_str(), "tickets-token");
        assert_eq!(
            auth.placement,
            Placement::Header {
                name: "X-Api-Key".into(),
                prefix: Some("Key ".into())
            }
        );
        assert!(
            config
                .mcp_server("other")
                .unwrap_err()
                .to_string()
                .contains("tickets")
        );
    }

    #[test]
    fn bad_mcp_declarations_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        for (text, expected) in [
            ("[mcp.servers.\"a.b\"]\nurl = \"http://x\"\n", "server name"),
            (
                "[mcp.servers.t]\nurl = \"http://x\"\neffect = \"harmless\"\n",
                "unknown effect",
            ),
            (
                "[mcp.servers.t]\nurl = \"http://x\"\nauth = { secret = \"s\", placement = \"header\" }\n",
                "needs header",
            ),
            (
                "[mcp.servers.t]\nurl = \"http://x\"\nauth = { secret = \"s\", placement = \"cookie\" }\n",
                "unknown auth placement",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = format!("{:#}", Config::load(&path).unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn urls_and_tool_overrides_are_checked_when_the_file_loads_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        for (text, key, why) in [
            (
                "[mcp.servers.tickets]\nurl = \"mcp.example.com/mcp\"\n",
                "mcp.servers.tickets.url: ",
                "is not a URL",
            ),
            (
                "[mcp.servers.tickets]\nurl = \"ftp://mcp.example.com/mcp\"\n",
                "mcp.servers.tickets.url: ",
                "scheme \"ftp\"",
            ),
            (
                "[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"localhost:8080/v1\"\n",
                "agents.a.base_url: ",
                "http",
            ),
            ("[client]\nserver = \"http://\"\n", "client.server: ", ""),
            (
                "[mcp.servers.t]\nurl = \"http://x\"\n[mcp.servers.t.tools.search]\neffect = \"harmless\"\n",
                "mcp.servers.t.tools.search.effect: ",
                "unknown effect \"harmless\"",
            ),
            (
                "[mcp.servers.t]\nurl = \"http://x\"\n[mcp.servers.t.tools.search]\nefect = \"read_only\"\n",
                "efect",
                "tools.search",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = format!("{:#}", Config::load(&path).unwrap_err());
            assert!(err.contains(key) && err.contains(why), "{text}: {err}");
            assert!(
                err.contains(&path.display().to_string()),
                "the file is named: {err}"
            );
        }
        std::fs::write(
            &path,
            "[mcp.servers.t]\nurl = \"https://mcp.example.com:8443/mcp\"\n",
        )
        .unwrap();
        Config::load(&path).expect("an https URL with a port loads");
    }

    #[test]
    fn an_oauth_server_is_read_with_its_grant_client_and_secret_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let text = r#"
[mcp.servers.tickets]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "client_credentials", client_id = "agent", private_key = "tickets-key", signing_alg = "RS256", scopes = ["tickets:read"], dpop = false } }
"#;
        std::fs::write(&path, text).unwrap();
        let config = Config::load(&path).unwrap();
        let server = config.mcp_server("tickets").unwrap();
        assert!(
            server.auth.is_none(),
            "M18: the vault places the OAuth token"
        );
        let oauth = server.oauth.as_ref().unwrap();
        assert_eq!(oauth.grant, Grant::ClientCredentials);
        assert_eq!(oauth.client_id.as_deref(), Some("agent"));
        assert_eq!(oauth.private_key.as_ref().unwrap().as_str(), "tickets-key");
        assert_eq!(oauth.signing_alg, SigningAlg::Rs256);
        assert_eq!(oauth.scopes, ["tickets:read"]);
        assert_eq!(oauth.dpop, Some(false), "DPoP turned off");
    }

    #[test]
    fn the_assertion_grants_are_read_with_their_source_and_identity_provider() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let text = r#"
[mcp.servers.wif]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "jwt_bearer", client_id = "workload", assertion_file = "tokens/mcp.jwt" } }

[mcp.servers.cmd]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "jwt_bearer", assertion_command = ["get-token", "--audience", "mcp"] } }

[mcp.servers.xaa]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "cross_app_access", client_id = "app", client_secret = "app-secret", id_token_file = "/run/id.jwt", idp_token_endpoint = "https://idp.example.com/token", idp_client_id = "idp-app", idp_client_secret = "idp-secret" } }
"#;
        std::fs::write(&path, text).unwrap();
        let config = Config::load(&path).unwrap();
        let wif = config.mcp_server("wif").unwrap().oauth.clone().unwrap();
        assert_eq!(wif.grant, Grant::JwtBearer);
        assert_eq!(
            wif.assertion,
            Some(AssertionSource::File(dir.path().join("tokens/mcp.jwt"))),
            "a relative path is relative to the file"
        );
        let cmd = config.mcp_server("cmd").unwrap().oauth.clone().unwrap();
        assert_eq!(cmd.client_id, None, "client authentication is optional");
        assert_eq!(
            cmd.assertion,
            Some(AssertionSource::Command(vec![
                "get-token".into(),
                "--audience".into(),
                "mcp".into()
            ]))
        );
        let xaa = config.mcp_server("xaa").unwrap().oauth.clone().unwrap();
        assert_eq!(xaa.grant, Grant::CrossAppAccess);
        assert_eq!(
            xaa.assertion,
            Some(AssertionSource::File("/run/id.jwt".into()))
        );
        let idp = xaa.identity_provider.unwrap();
        assert_eq!(idp.token_endpoint, "https://idp.example.com/token");
        assert_eq!(idp.client_id, "idp-app");
        assert_eq!(idp.client_secret.unwrap().as_str(), "idp-secret");
    }

    #[test]
    fn bad_assertion_grant_declarations_are_named_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let server = "[mcp.servers.t]\nurl = \"https://x/mcp\"\n";
        let idp = r#"idp_token_endpoint = "https://idp/token", idp_client_id = "i""#;
        for (oauth, expected) in [
            (
                r#"grant = "jwt_bearer""#.to_string(),
                "needs assertion_file = \"PATH\" or assertion_command",
            ),
            (
                r#"grant = "jwt_bearer", assertion_file = "a", assertion_command = ["b"]"#.into(),
                "not both",
            ),
            (
                r#"grant = "jwt_bearer", assertion_command = []"#.into(),
                "assertion_command needs a program",
            ),
            (
                r#"grant = "jwt_bearer", id_token_file = "a""#.into(),
                "id_token_file goes with grant \"cross_app_access\"",
            ),
            (
                r#"grant = "client_credentials", client_id = "c", client_secret = "s", assertion_file = "a""#.into(),
                "assertion_file goes with grant \"jwt_bearer\"",
            ),
            (
                r#"grant = "jwt_bearer", assertion_file = "a", idp_client_id = "i""#.into(),
                "idp_client_id goes with grant \"cross_app_access\"",
            ),
            (
                format!(r#"grant = "cross_app_access", id_token_file = "a", {idp}"#),
                "needs client_id",
            ),
            (
                r#"grant = "cross_app_access", client_id = "c", id_token_file = "a""#.into(),
                "needs idp_token_endpoint",
            ),
            (
                r#"grant = "cross_app_access", client_id = "c", id_token_file = "a", idp_token_endpoint = "ftp://idp", idp_client_id = "i""#.into(),
                "idp_token_endpoint",
            ),
            (
                format!(r#"grant = "cross_app_access", client_id = "c", {idp}"#),
                "needs id_token_file = \"PATH\" or id_token_command",
            ),
        ] {
            let text = format!("{server}auth = {{ oauth = {{ {oauth} }} }}\n");
            std::fs::write(&path, &text).unwrap();
            let err = format!("{:#}", Config::load(&path).unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
            assert!(
                err.contains("[mcp.servers.t] auth.oauth"),
                "the key is named: {err}"
            );
        }
    }

    #[test]
    fn bad_oauth_declarations_are_named_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        let server = "[mcp.servers.t]\nurl = \"https://x/mcp\"\n";
        for (auth, expected) in [
            (r#"{ oauth = { grant = "password" } }"#, "unknown grant"),
            (
                r#"{ oauth = { grant = "client_credentials", client_secret = "s" } }"#,
                "needs client_id",
            ),
            (
                r#"{ oauth = { grant = "client_credentials", client_id = "c" } }"#,
                "needs client_secret or private_key",
            ),
            (
                r#"{ oauth = { grant = "authorization_code", auth_method = "private_key_jwt" } }"#,
                "needs private_key",
            ),
            (
                r#"{ oauth = { grant = "authorization_code", auth_method = "magic" } }"#,
                "unknown auth_method",
            ),
            (
                r#"{ oauth = { grant = "authorization_code", client_metadata_url = "http://x/c.json" } }"#,
                "client_metadata_url must be an https URL",
            ),
            (
                r#"{ secret = "s", placement = "bearer", oauth = { grant = "authorization_code" } }"#,
                "auth.oauth stands alone",
            ),
            (r#"{ placement = "bearer" }"#, "auth needs secret"),
        ] {
            let text = format!("{server}auth = {auth}\n");
            std::fs::write(&path, &text).unwrap();
            let err = format!("{:#}", Config::load(&path).unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
            assert!(
                err.contains("[mcp.servers.t]"),
                "the server is named: {err}"
            );
        }
    }
}
