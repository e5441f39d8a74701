//! `runwarden mcp login` and `runwarden mcp auth status`: an operator authorizes an
//! OAuth server once, and sees what the vault holds for each (never a token).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use runwarden_mcp::{McpClient, McpError, Request};
use runwarden_oauth::{AuthorizationPrompt, LOGIN_WAIT, OAuthClient, OAuthStatus};
use serde::Serialize;

use super::Context;
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum AuthCommand {
    /// Per OAuth server: grant, issuer, scopes, whether an access and a refresh token are
    /// held, and when the access token expires.
    Status,
}

/// Prints the authorization URL on stderr, one line the operator (or a script driving a
/// browser) can pick up: `authorize server NAME: open URL`.
pub(crate) struct PrintedPrompt;

impl AuthorizationPrompt for PrintedPrompt {
    fn open(&self, server: &str, url: &str) {
        eprintln!("authorize server {server}: open {url}");
        eprintln!(
            "waiting up to {} s for the browser to come back to runwarden...",
            LOGIN_WAIT.as_secs()
        );
    }
}

pub(crate) async fn run(cx: &Context, command: AuthCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuthCommand::Status => status(cx).await,
    }
}

/// `mcp login NAME`: forgets the held token, then lists the server's tools with the
/// operator at hand, so the server's own 401 drives discovery and the grant.
pub(crate) async fn login(cx: &Context, name: &str) -> anyhow::Result<ExitCode> {
    let server = cx.config.mcp_server(name)?;
    if server.oauth.is_none() {
        bail!(
            "server {name} is not configured for OAuth: set auth = {{ oauth = {{ grant = \"authorization_code\" }} }} in [mcp.servers.{name}]"
        );
    }
    let egress = cx.root.egress().await?;
    let mut config = server.clone();
    // The operator's browser round trip is part of this one operation's budget.
    config.timeout = config.timeout.max(LOGIN_WAIT + Duration::from_secs(30));
    let client = McpClient::new(config, egress)
        .with_actor("cli")
        .with_authorization_prompt(Arc::new(PrintedPrompt));
    let oauth = client
        .oauth()
        .cloned()
        .with_context(|| format!("server {name}: OAuth could not start (check its url)"))?;
    oauth.forget().await?;
    let stop = super::mcp::ctrl_c_flag();
    let outcome = client.send_request(Request::ListTools, Some(&stop)).await;
    if let Err(error) = client.close().await {
        tracing::info!(server = %name, %error, "could not end the MCP session");
    }
    match outcome {
        Ok(_) | Err(McpError::NoTools { .. }) => {}
        Err(error) => {
            return Err(error).with_context(|| format!("while authorizing server {name}"));
        }
    }
    let status = oauth.status().await?;
    output::emit(cx.json, &ServerStatus::new(name, &status), || {
        format!(
            "server {name} authorized\n{}",
            ServerStatus::new(name, &status).lines()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// One server's line in `mcp auth status`.
#[derive(Serialize)]
struct ServerStatus<'a> {
    server: &'a str,
    #[serde(flatten)]
    status: &'a OAuthStatus,
}

impl<'a> ServerStatus<'a> {
    fn new(server: &'a str, status: &'a OAuthStatus) -> Self {
        Self { server, status }
    }

    fn lines(&self) -> String {
        let s = self.status;
        let expires = match s.expires_at_ms {
            Some(ms) => chrono::DateTime::from_timestamp_millis(ms)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "unknown".into()),
            None if s.access_token => "not given".into(),
            None => "-".into(),
        };
        // The assertion grants: where the JWT comes from, and the identity provider.
        let mut source = String::new();
        if let Some(from) = &s.assertion_source {
            source.push_str(&format!(", JWT from {from}"));
        }
        if let Some(idp) = &s.identity_provider {
            source.push_str(&format!(", identity provider {idp}"));
        }
        format!(
            "  {}: grant {}{source}, issuer {}, scopes [{}], client {}{}, access token {}{}, refresh token {}, expires {}",
            self.server,
            s.grant,
            s.issuer.as_deref().unwrap_or("(not discovered)"),
            s.scopes.join(" "),
            s.client_id.as_deref().unwrap_or("-"),
            if s.registered { " (registered)" } else { "" },
            if s.access_token { "held" } else { "none" },
            match &s.dpop_jkt {
                Some(jkt) => format!(" (DPoP-bound, key {jkt})"),
                None => String::new(),
            },
            if s.refresh_token { "held" } else { "none" },
            expires
        )
    }
}

async fn status(cx: &Context) -> anyhow::Result<ExitCode> {
    let egress = cx.root.egress().await?;
    let mut found = Vec::new();
    for server in cx.config.mcp_servers.values() {
        let Some(settings) = &server.oauth else {
            continue;
        };
        let client = OAuthClient::new(egress.clone(), &server.name, &server.url, settings.clone())?;
        found.push((server.name.clone(), client.status().await?));
    }
    let views: Vec<ServerStatus<'_>> = found
        .iter()
        .map(|(name, status)| ServerStatus::new(name, status))
        .collect();
    output::emit(cx.json, &serde_json::json!({ "servers": views }), || {
        if views.is_empty() {
            return "no server is configured for OAuth".into();
        }
        let mut text = String::from("OAuth servers:");
        for view in &views {
            text.push('\n');
            text.push_str(&view.lines());
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}
