//! The process's own settings: the console, telemetry, metrics, the log, the API server
//! and the workers, each checked from its section.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;

use super::file::{ConsoleSection, ServeSection, WorkerSection};
use super::load::seconds;

/// `[console]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsoleSettings {
    /// How long a console session lasts after sign-in.
    pub(crate) session: Duration,
}

pub(super) fn console_settings(section: ConsoleSection) -> anyhow::Result<ConsoleSettings> {
    let hours = section.session_hours.unwrap_or(12);
    if !(1..=720).contains(&hours) {
        bail!("[console] session_hours must be between 1 and 720 (30 days), not {hours}");
    }
    Ok(ConsoleSettings {
        session: Duration::from_secs(hours * 3600),
    })
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
pub(super) fn otlp_endpoint(text: &str) -> anyhow::Result<String> {
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

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsSettings {
    /// `/metrics` on the API port needs a viewer token (the default).
    pub(crate) require_token: bool,
    /// A second listener that serves `/metrics` alone, without a token (bind it where only
    /// the scraper reaches).
    pub(crate) listen: Option<String>,
}

/// `[gateway]`: the tools each API token's MCP clients may see and call at `/mcp`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GatewaySettings {
    /// Tool patterns by token name; a token not listed may not use the gateway.
    pub(crate) tokens: std::collections::BTreeMap<String, Vec<String>>,
}

impl GatewaySettings {
    /// The tool patterns of `token`, or why it may not use the gateway.
    pub(crate) fn tools_of(&self, token: &str) -> anyhow::Result<&[String]> {
        match self.tokens.get(token) {
            Some(tools) if !tools.is_empty() => Ok(tools),
            _ => anyhow::bail!(
                "token {token} may not use the MCP gateway: list the tools it may call under [gateway.tokens.{token}] tools = [...] in the configuration"
            ),
        }
    }
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
    pub(super) fn parse(at: &str, text: &str) -> anyhow::Result<Self> {
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

pub(super) fn serve_settings(
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

impl WorkerSettings {
    /// How retryable failures and stale reclaims go back to the queue.
    pub(crate) fn retry(&self) -> runwarden_runtime::RetryPolicy {
        runwarden_runtime::RetryPolicy {
            max_requeues: self.max_requeues,
            base: self.retry_base,
            ..runwarden_runtime::RetryPolicy::default()
        }
    }
}

pub(super) fn worker_settings(section: WorkerSection) -> anyhow::Result<WorkerSettings> {
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
