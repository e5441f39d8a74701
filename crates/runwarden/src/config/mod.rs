//! `runwarden.toml`: one file, environment overrides, paths relative to the file.
//!
//! [`Config`] is the resolved configuration the process runs with. `file.rs` holds the
//! file's types as serde reads them (their doc comments are docs/configuration.md, which
//! `reference.rs` generates); `load.rs` parses, checks and resolves them into a
//! [`Config`]; `settings.rs`, `agents.rs`, `mcp.rs`, `oauth.rs` and `limits.rs` check one
//! kind of section each; `template.rs` is the file `runwarden init` writes.

mod agents;
mod file;
mod limits;
mod load;
mod local;
mod mcp;
mod oauth;
mod policy;
#[cfg(test)]
mod reference;
mod settings;
mod template;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use runwarden_mcp::ServerConfig;
use runwarden_store_postgres::PgOptions;
use runwarden_store_sqlite::Durability;
use runwarden_vault::{Algorithm, EgressConfig, EgressPolicy, MAX_TICK, MasterKey};

pub(crate) use agents::{AgentConfig, ProviderConfig};
pub(crate) use mcp::ServerApproval;
pub(crate) use policy::{PolicyConfig, policy_files, read_files};
pub(crate) use settings::{
    ConsoleSettings, LogFormat, MetricsSettings, ServeSettings, TlsFiles, WorkerSettings,
    peek_otlp_endpoint,
};
pub(crate) use template::TEMPLATE;

use crate::store_url::StoreUrl;

/// The environment variable that names the config file when `--config` is absent.
pub(crate) const CONFIG_ENV: &str = "RUNWARDEN_CONFIG";
/// The store URL, which overrides the configuration file's `[store]`.
pub(crate) const DATABASE_URL_ENV: &str = "RUNWARDEN_DATABASE_URL";
/// A master key given as 64 hex characters instead of a key file.
pub(crate) const MASTER_KEY_ENV: &str = "RUNWARDEN_MASTER_KEY";

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
    /// `[store] durability`: what the SQLite writes a promise rests on survive.
    pub(crate) durability: Durability,
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
    /// `[gateway]`: who may use the MCP endpoint, and what each token sees there.
    pub(crate) gateway: settings::GatewaySettings,
    /// `[telemetry] record_arguments`: tool call arguments on their spans.
    pub(crate) record_arguments: bool,
    /// `[console]`.
    pub(crate) console: ConsoleSettings,
    /// `[limits]`: the limits on calls (R14); empty: none.
    pub(crate) limits: runwarden_runtime::limits::Limits,
    /// `[policy]`: the policies every call is decided by; `None` decides nothing.
    pub(crate) policy: Option<PolicyConfig>,
}

/// True when `$RUNWARDEN_MASTER_KEY` supplies the key. An empty value does not count, the
/// same rule [`Config::master_key`] applies, so every command agrees on where the key is.
pub(crate) fn master_key_from_env() -> bool {
    env(MASTER_KEY_ENV).is_some()
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
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

    /// G1: the approval a server's configuration asks for a tool (`remote`) called through
    /// the gateway, which has no agent of its own to add to it.
    pub(crate) fn server_approval(&self, server: &str, remote: &str) -> Option<Duration> {
        let policy = self.approvals.get(server).cloned().unwrap_or_default();
        let (required, timeout) = policy.tools.get(remote).copied().unwrap_or_default();
        required.unwrap_or(policy.required).then(|| {
            timeout
                .or(policy.timeout)
                .unwrap_or(runwarden_runtime::decision::DEFAULT_APPROVAL_TIMEOUT)
        })
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

/// The local servers that run in a sandbox, by name.
pub(crate) fn sandboxed_servers(config: &Config) -> Vec<&str> {
    config
        .mcp_servers
        .values()
        .filter(|s| {
            s.stdio
                .as_ref()
                .is_some_and(|l| l.sandbox == runwarden_mcp::stdio::SandboxMode::Namespace)
        })
        .map(|s| s.name.as_str())
        .collect()
}
