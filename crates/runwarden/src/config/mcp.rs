//! `[mcp.servers.NAME]`: a server's URL, credential, limits, effects and approvals.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use runwarden_mcp::{Effect, ElicitationPolicy, ServerConfig};
use runwarden_oauth::OAuthSettings;
use runwarden_vault::{Credential, Placement, SecretName};

use super::file::{AuthSection, ServerSection, ToolSection};
use super::load::{http_url, seconds};
use super::local::{local_server, stray_local_setting};
use super::oauth::oauth_settings;

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

/// A server from `[mcp.servers.NAME]`, checked so that its tools' local names
/// stay unique (`<name>__<tool>`) and its effects are the operator's.
pub(super) fn server(
    name: &str,
    mut section: ServerSection,
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
    let (url, local) = match (section.url.take(), section.command.is_some()) {
        (Some(_), true) => bail!(
            "{at}: a server has either url (reached over HTTP) or command (started by runwarden), not both"
        ),
        (None, false) => bail!(
            "{at}: give url = \"https://...\" for a server reached over HTTP, or command = \"program\" for a local one"
        ),
        (None, true) => (None, Some(local_server(name, &mut section, resolve)?)),
        (Some(url), false) => (Some(url), None),
    };
    if let Some(url) = &url {
        if url.trim().is_empty() {
            bail!("mcp.servers.{name}.url is empty: give the server's Streamable HTTP endpoint");
        }
        http_url(&format!("mcp.servers.{name}.url"), url)?;
        if let Some(key) = stray_local_setting(&section) {
            bail!(
                "{at}: {key} is for a local server (one with command); this one is reached by url"
            );
        }
    }
    let (auth, oauth) = match section.auth {
        None => (None, None),
        Some(auth) => credential(auth, &at, resolve)?,
    };
    // Exactly one of the two is set, as checked above.
    let mut server = match local {
        Some(local) => ServerConfig::local(name, local),
        None => ServerConfig::new(name, url.unwrap_or_default()),
    };
    if oauth.is_some() && url::Url::parse(&server.url).is_err() {
        bail!("{at}: url is not a URL, and OAuth needs one to find the authorization server");
    }
    server.auth = auth;
    server.oauth = oauth;
    if let Some(text) = section.effect {
        server.effect = effect(&text, &format!("mcp.servers.{name}.effect"))?;
    }
    limits(
        &mut server,
        section.timeout_seconds,
        section.max_response_bytes,
        &at,
    )?;
    protocol_options(
        &mut server,
        section.elicitation,
        section.progress_extends_deadline,
        section.protocol,
        &at,
    )?;
    if let Some(text) = section.sampling {
        server.sampling = match text.as_str() {
            "client" => true,
            "refuse" => false,
            _ => anyhow::bail!(
                "{at}: unknown sampling {text:?}: use \"refuse\" (the default) or \"client\""
            ),
        };
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
    for (tool, declared) in section.tools {
        tool_settings(name, tool, declared, &mut server, &mut policy)?;
    }
    Ok((server, policy))
}

/// `auth = { ... }`: a vault secret and its placement, or `oauth = { ... }` alone.
fn credential(
    auth: AuthSection,
    at: &str,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<(Option<Credential>, Option<OAuthSettings>)> {
    if let Some(settings) = auth.oauth {
        if auth.secret.is_some()
            || auth.placement.is_some()
            || auth.header.is_some()
            || auth.prefix.is_some()
            || auth.param.is_some()
        {
            bail!(
                "{at}: auth.oauth stands alone: remove secret, placement, header, prefix and param (the vault places the OAuth token)"
            );
        }
        return Ok((None, Some(oauth_settings(settings, at, resolve)?)));
    }
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
            bail!("{at}: unknown auth placement {other:?}: use bearer, basic, header or query")
        }
        _ => bail!("{at}: header goes with placement \"header\" and param with \"query\""),
    };
    if auth.prefix.is_some() && !matches!(placement, Placement::Header { .. }) {
        bail!("{at}: prefix goes with placement \"header\"");
    }
    let credential = Credential {
        secret: SecretName::new(secret).with_context(|| format!("{at}: auth secret"))?,
        placement,
    };
    Ok((Some(credential), None))
}

/// `timeout_seconds` and `max_response_bytes`: the bounds of one operation.
fn limits(
    server: &mut ServerConfig,
    timeout: Option<f64>,
    max_response_bytes: Option<u64>,
    at: &str,
) -> anyhow::Result<()> {
    if let Some(timeout) = timeout {
        server.timeout = seconds(&format!("{at} timeout_seconds"), timeout)?;
        // The budget is the whole operation's; below the minimum a handshake and a call
        // cannot both fit, so it is refused here rather than at every call.
        if server.timeout < runwarden_mcp::MIN_BUDGET {
            bail!(
                "{at} timeout_seconds = {timeout} is too small: it is the budget of a whole operation (the handshake and the call), and must be at least {} s",
                runwarden_mcp::MIN_BUDGET.as_secs()
            );
        }
    }
    if let Some(limit) = max_response_bytes {
        let ceiling = runwarden_mcp::MAX_RESPONSE_BYTES_CEILING;
        if limit < 1024 || limit > ceiling as u64 {
            bail!(
                "{at} max_response_bytes = {limit} is out of range: give a number of bytes from 1024 to {ceiling} (the default is {})",
                runwarden_mcp::DEFAULT_MAX_RESPONSE_BYTES
            );
        }
        server.max_response_bytes = limit as usize;
    }
    Ok(())
}

/// `elicitation`, `progress_extends_deadline` and `protocol`: how the client talks to
/// the server.
fn protocol_options(
    server: &mut ServerConfig,
    elicitation: Option<String>,
    progress_extends_deadline: Option<bool>,
    protocol: Option<String>,
    at: &str,
) -> anyhow::Result<()> {
    if let Some(text) = elicitation {
        // "operator" hands a server's questions to a person; anything else is a typo.
        server.elicitation = ElicitationPolicy::parse(&text).with_context(|| {
            format!(
                "{at}: unknown elicitation {text:?}: use \"decline\" (the default) or \"operator\""
            )
        })?;
    }
    if let Some(extends) = progress_extends_deadline {
        server.progress_extends_deadline = extends;
    }
    if let Some(text) = protocol {
        // "auto" negotiates 2026-07-28 when served; "2025-11-25" only handshakes.
        server.protocol = runwarden_mcp::ProtocolPolicy::parse(&text).with_context(|| {
            format!("{at}: unknown protocol {text:?}: use \"auto\" (the default) or \"2025-11-25\"")
        })?;
    }
    Ok(())
}

/// `[mcp.servers.NAME.tools.TOOL]`: the tool's effect and approval, over the server's.
fn tool_settings(
    name: &str,
    tool: String,
    declared: ToolSection,
    server: &mut ServerConfig,
    policy: &mut ServerApproval,
) -> anyhow::Result<()> {
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
    Ok(())
}
