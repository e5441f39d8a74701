//! Reading the file: parse it, check every value with the key named, resolve paths
//! against the file and apply the environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use runwarden_store_postgres::PgOptions;
use runwarden_store_sqlite::Durability;
use runwarden_vault::Algorithm;

use super::file::{FileConfig, StoreSection};
use super::settings::{
    LogFormat, MetricsSettings, console_settings, otlp_endpoint, serve_settings, worker_settings,
};
use super::{Config, DATABASE_URL_ENV, env};
use crate::store_url::StoreUrl;

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
pub(super) fn http_url(key: &str, text: &str) -> anyhow::Result<()> {
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

/// Where the data lives ([`store_url`]) and what its promised writes survive
/// ([`durability_of`]).
fn store_and_durability(
    section: StoreSection,
    data_dir: &Path,
    resolve: &impl Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<(StoreUrl, Durability)> {
    let text = env("RUNWARDEN_DURABILITY").or(section.durability.clone());
    let store = store_url(section, data_dir, resolve)?;
    let durability = durability_of(text, &store)?;
    Ok((store, durability))
}

/// `[store] durability` (or `$RUNWARDEN_DURABILITY`): `power_cut`, the default, or
/// `process_crash`, which SQLite alone offers.
fn durability_of(text: Option<String>, store: &StoreUrl) -> anyhow::Result<Durability> {
    let durability = match text.as_deref().map(str::trim) {
        None | Some("power_cut") => Durability::PowerCut,
        Some("process_crash") => Durability::ProcessCrash,
        Some(other) => bail!(
            "[store] durability: unknown {other:?}: use \"power_cut\" (the default: promises survive a power cut) or \"process_crash\" (faster: they survive runwarden being killed, not a power cut)"
        ),
    };
    if durability != Durability::PowerCut && matches!(store, StoreUrl::Postgres(_)) {
        bail!(
            "[store] durability = \"process_crash\" is for SQLite only: on PostgreSQL the server's own synchronous_commit decides; remove the key"
        );
    }
    Ok(durability)
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

/// `[egress] allow`, or `$RUNWARDEN_EGRESS_ALLOW` (comma-separated) in its place.
fn egress_allow(configured: Vec<String>) -> Vec<String> {
    match env("RUNWARDEN_EGRESS_ALLOW") {
        Some(list) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => configured,
    }
}

pub(super) fn seconds(name: &str, value: f64) -> anyhow::Result<Duration> {
    if !(value.is_finite() && value > 0.0 && value <= 3600.0) {
        bail!("{name} must be a number of seconds above 0 and at most 3600, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

impl Config {
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
        let (store, durability) = store_and_durability(file.store, &data_dir, &resolve)?;
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
        let egress_allow = egress_allow(file.egress.allow);
        let mut mcp_servers = BTreeMap::new();
        let mut approvals = BTreeMap::new();
        for (name, section) in file.mcp.servers {
            let (server, policy) = super::mcp::server(&name, section, &resolve)?;
            mcp_servers.insert(name.clone(), server);
            approvals.insert(name, policy);
        }
        let limits = file.limits;
        let mut config = Self {
            path: path.to_path_buf(),
            mcp_servers,
            approvals,
            data_dir,
            store,
            pg_options,
            durability,
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
                .map(|(name, section)| {
                    Ok((
                        name.clone(),
                        super::agents::agent(&name, section, &resolve)?,
                    ))
                })
                .collect::<anyhow::Result<_>>()?,
            worker: worker_settings(file.worker)?,
            serve: serve_settings(file.serve, &resolve)?,
            client_server: (file.client.server)
                .map(|url| http_url("client.server", &url).map(|()| url))
                .transpose()?,
            client_token_file: file.client.token_file.map(&resolve),
            metrics: MetricsSettings {
                require_token: file.metrics.require_token.unwrap_or(true),
                listen: file.metrics.listen,
            },
            gateway: gateway_settings(file.gateway),
            record_arguments: file.telemetry.record_arguments.unwrap_or(false),
            console: console_settings(file.console)?,
            policy: (file.policy.as_ref())
                .map(|section| super::policy::policy(section, &base))
                .transpose()?,
            limits: Default::default(),
        };
        // Limits name the servers and agents above.
        config.limits = super::limits::limits(limits, &config)?;
        Ok(config)
    }
}

/// `[gateway]`: each token's tool patterns, by the token's name.
fn gateway_settings(section: super::file::GatewaySection) -> super::settings::GatewaySettings {
    super::settings::GatewaySettings {
        tokens: (section.tokens.into_iter())
            .map(|(name, token)| (name, token.tools))
            .collect(),
    }
}
