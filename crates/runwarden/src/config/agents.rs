//! `[agents.NAME]`: which model an agent talks to, its tools, budgets and approvals.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use runwarden_vault::SecretName;

use super::file::AgentSection;
use super::load::{http_url, seconds};

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
    /// P1: what its policies read as `principal.tags`.
    pub(crate) tags: Vec<String>,
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

pub(super) fn agent(
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
    runwarden_runtime::rules::check_tags(&section.tags)
        .map_err(|e| anyhow::anyhow!("{at} tags: {e}"))?;
    Ok(AgentConfig {
        name: name.to_string(),
        tags: section.tags,
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
