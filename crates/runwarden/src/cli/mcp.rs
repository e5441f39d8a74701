//! `runwarden mcp`: import a server's tools, list the catalogue, check liveness, call a tool.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use runwarden_mcp::{
    CatalogueEntry, CatalogueStore, ElicitationAnswer, ElicitationFuture, ElicitationRequest,
    Elicitor, ElicitorHandle, McpCall, McpClient, McpError, Reply, Request, ServerConfig,
    ServerHealth, ToolOutcome, build_catalogue,
};
use runwarden_vault::CancelFlag;
use serde_json::{Map, Value};

use super::{Context, mcp_refusal};
use crate::output;
use crate::views::mcp::{ToolView, server_views, tool_line};

/// Exit status of a command the operator interrupted (128 + SIGINT).
const EXIT_CANCELLED: u8 = 130;

#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Walk the server's tools/list and store its normalised catalogue.
    Import {
        /// The server's name in [mcp.servers].
        name: String,
    },
    /// Servers, their tools (local name, effect, the server's name or why it is refused) and last contact.
    List {
        /// Only this server.
        name: Option<String>,
    },
    /// Probe every configured server (server/discover at 2026-07-28, else ping) and show
    /// its liveness, the protocol version it speaks and the probe used.
    Health,
    /// Call one tool as an operator would test it; Ctrl-C cancels the call in flight.
    Call {
        /// The server's name.
        name: String,
        /// The tool: its remote name or its local name (`server__tool`).
        tool: String,
        /// The arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Answers a question the server asks during the call (`elicitation/create`, for a
        /// server with `elicitation = "operator"`) with this JSON object; fields left out
        /// take the defaults the question gives. Without it, questions are declined.
        #[arg(long)]
        answer: Option<String>,
        /// Send the call even when the imported catalogue does not offer the tool (unknown,
        /// or refused at import); the audit rows say it was forced.
        #[arg(long)]
        force: bool,
    },
    /// Authorize an OAuth server now (authorization code + PKCE): prints the URL to
    /// open and waits for the browser on a loopback redirect; the tokens stay in the vault.
    Login {
        /// The server's name in [mcp.servers].
        name: String,
    },
    /// What the vault holds for OAuth servers (never a token).
    #[command(subcommand)]
    Auth(super::mcp_auth::AuthCommand),
    /// Declare a server in the configuration file (its comments are kept); then import it.
    Add(super::mcp_edit::AddArgs),
    /// Remove a server from the configuration file.
    Remove {
        /// The server's name in [mcp.servers].
        name: String,
    },
}

impl McpCommand {
    /// The subcommand's name when it needs the local installation (the store, the vault
    /// or the configuration file): no API route does it.
    pub(crate) fn local_only(&self) -> Option<&'static str> {
        match self {
            Self::Import { .. } => Some("mcp import"),
            Self::Call { .. } => Some("mcp call"),
            Self::Add(_) => Some("mcp add"),
            Self::Remove { .. } => Some("mcp remove"),
            Self::Login { .. } => Some("mcp login"),
            Self::Auth(_) => Some("mcp auth"),
            Self::List { .. } | Self::Health => None,
        }
    }
}

/// A flag that Ctrl-C cancels, through the same signal path a run uses.
pub(super) fn ctrl_c_flag() -> CancelFlag {
    let flag = CancelFlag::new();
    let on_ctrl_c = flag.clone();
    super::signals::on_interrupt(move || on_ctrl_c.cancel());
    flag
}

pub(crate) async fn run(cx: &Context, command: McpCommand) -> anyhow::Result<ExitCode> {
    match command {
        McpCommand::Import { name } => import(cx, &name).await,
        McpCommand::List { name } => list(cx, name.as_deref()).await,
        McpCommand::Health => health(cx).await,
        McpCommand::Call {
            name,
            tool,
            args,
            answer,
            force,
        } => call(cx, &name, &tool, &args, answer.as_deref(), force).await,
        McpCommand::Login { name } => super::mcp_auth::login(cx, &name).await,
        McpCommand::Auth(command) => super::mcp_auth::run(cx, command).await,
        McpCommand::Add(args) => super::mcp_edit::add(cx, args),
        McpCommand::Remove { name } => super::mcp_edit::remove(cx, &name),
    }
}

/// The process's client of `server` (its session is ended when the command returns).
async fn client(
    cx: &Context,
    server: &ServerConfig,
) -> anyhow::Result<(Arc<McpClient>, Arc<dyn CatalogueStore>)> {
    let store = cx.root.catalogue().await?;
    // M18: an operator is at hand: an authorization code grant may ask them.
    cx.root
        .set_authorization_prompt(Arc::new(super::mcp_auth::PrintedPrompt));
    let client = cx
        .root
        .mcp_clients("cli")
        .await?
        .get(&server.name)
        .cloned()
        .with_context(|| format!("server {} is not configured", server.name))?;
    Ok((client, store))
}

async fn import(cx: &Context, name: &str) -> anyhow::Result<ExitCode> {
    let server = cx.config.mcp_server(name)?;
    let (client, store) = client(cx, server).await?;
    let stop = ctrl_c_flag();
    let listed = client.send_request(Request::ListTools, Some(&stop)).await;
    let trail = client.last_request().map(|t| t.trail).unwrap_or_default();
    let tools = match listed {
        Ok(Reply::Tools(tools)) => tools,
        Ok(_) => bail!("server {name} answered tools/list with something else"),
        Err(error @ McpError::NoTools { .. }) => {
            // A server may be reachable and healthy yet offer no tools (only prompts or
            // resources): that is an answer, not a failure. The stored catalogue is left
            // as it was.
            let report = serde_json::json!({ "server": name, "imported": 0, "refused": 0, "tools": [], "offers_tools": false });
            output::emit(cx.json, &report, || format!("{error}; nothing imported"));
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) if e.is_cancelled() => {
            output::error(cx.json, &anyhow::anyhow!("cancelled: {e}"));
            return Ok(ExitCode::from(EXIT_CANCELLED));
        }
        Err(e) => {
            return Err(anyhow::anyhow!("{e} {trail}"))
                .with_context(|| format!("while importing the catalogue of server {name}"));
        }
    };
    // M10 (amended): a declaration for a tool the server does not offer is refused before
    // anything is stored.
    server
        .check_tool_overrides(tools.iter().map(|t| t.name.as_str()))
        .with_context(|| format!("while importing the catalogue of server {name}"))?;
    let entries = build_catalogue(server, &tools, chrono::Utc::now().timestamp_millis());
    store
        .catalogue_replace(name, entries.clone())
        .await
        .with_context(|| format!("while storing the catalogue of server {name}"))?;
    let views: Vec<ToolView<'_>> = entries.iter().map(|e| ToolView::new(e, server)).collect();
    let refused = views.iter().filter(|v| !v.usable).count();
    // The JSON report also carries each tool's input schema exactly as the server sent it,
    // so an operator can see what a refusal was about (and what the normaliser kept).
    let received: Vec<Value> = views
        .iter()
        .zip(&tools)
        .map(|(view, tool)| {
            let mut view = serde_json::to_value(view).unwrap_or(Value::Null);
            view["received_input_schema"] = tool.input_schema.clone();
            view
        })
        .collect();
    let report = serde_json::json!({ "server": name, "imported": views.len(), "refused": refused, "offers_tools": true, "tools": received });
    output::emit(cx.json, &report, || {
        let mut text = format!(
            "imported {} from {name} ({refused} refused)",
            output::count(views.len() as u64, "tool", "tools")
        );
        for view in &views {
            text.push('\n');
            text.push_str(&view.line());
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}

fn contact_line(health: Option<&ServerHealth>) -> String {
    let Some(h) = health else {
        return "never contacted".into();
    };
    let mut parts = Vec::new();
    if let Some(ms) = h.last_success_ms {
        parts.push(format!("last success {}", output::time(ms)));
    }
    if let Some(ms) = h.last_failure_ms {
        parts.push(format!(
            "last failure {} ({})",
            output::time(ms),
            h.last_error.as_deref().unwrap_or("")
        ));
    }
    if parts.is_empty() {
        "never contacted".into()
    } else {
        parts.join("; ")
    }
}

/// The servers for people, from their JSON (so the store's and the API's print the same).
fn servers_text(servers: &[Value]) -> String {
    if servers.is_empty() {
        return "no MCP servers configured: add one with `runwarden mcp add NAME URL` (or `runwarden mcp add NAME -- COMMAND` for a local one)".into();
    }
    let mut text = String::new();
    for s in servers {
        let name = s["name"].as_str().unwrap_or_default();
        // A local server shows its command and sandbox where another shows its URL.
        let target = match s["command"].as_str() {
            Some(command) => format!(
                "stdio `{command}`, sandbox {}",
                s["sandbox"].as_str().unwrap_or_default()
            ),
            None => s["url"].as_str().unwrap_or_default().to_string(),
        };
        text.push_str(&format!(
            "{name} {target} (default effect {}, {} s budget): {}\n",
            s["effect"].as_str().unwrap_or_default(),
            s["timeout_seconds"],
            contact_text(s)
        ));
        let tools = s["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
        if tools.is_empty() {
            text.push_str(&format!(
                "  no tools imported: run `runwarden mcp import {name}`\n"
            ));
        }
        for tool in tools {
            text.push_str(&tool_line(tool));
            text.push('\n');
        }
    }
    text.trim_end().to_string()
}

/// A server view's last contact, as [`contact_line`] says it.
fn contact_text(server: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(time) = server["last_success"].as_str() {
        parts.push(format!("last success {time}"));
    }
    if let Some(time) = server["last_failure"].as_str() {
        parts.push(format!(
            "last failure {time} ({})",
            server["last_error"].as_str().unwrap_or("")
        ));
    }
    if parts.is_empty() {
        "never contacted".into()
    } else {
        parts.join("; ")
    }
}

/// `GET /v1/mcp/servers`: the server's configured MCP servers, tools and liveness.
async fn servers_from(server: &crate::client::ApiClient) -> anyhow::Result<Vec<Value>> {
    let answer = server.get("/v1/mcp/servers").await?;
    let body = server.expect(answer).await?;
    Ok(body["servers"].as_array().cloned().unwrap_or_default())
}

async fn list(cx: &Context, only: Option<&str>) -> anyhow::Result<ExitCode> {
    if let Some(server) = &cx.server {
        let servers: Vec<Value> = servers_from(server)
            .await?
            .into_iter()
            .filter(|s| only.is_none_or(|name| s["name"] == name))
            .collect();
        if let (Some(name), true) = (only, servers.is_empty()) {
            bail!("the server at --server has no MCP server named {name:?}");
        }
        output::emit(cx.json, &servers, || servers_text(&servers));
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(name) = only {
        cx.config.mcp_server(name)?;
    }
    let store = cx.root.catalogue().await?;
    let catalogue = store.catalogue_list(only).await?;
    let health = store.health_list().await?;
    let servers = server_views(&cx.config, only, &catalogue, &health);
    let views: Vec<Value> = servers
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    output::emit(cx.json, &views, || servers_text(&views));
    // M10 (amended): the list is printed either way, so the operator sees the names the
    // server offers; a declaration for a tool it does not offer then fails the command.
    for server in cx.config.mcp_servers.values() {
        let offered: Vec<&str> = catalogue
            .iter()
            .filter(|e| e.server == server.name)
            .map(|e| e.remote_name.as_str())
            .collect();
        if only.is_none_or(|name| server.name == name) && !offered.is_empty() {
            server.check_tool_overrides(offered.iter().copied())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mcp health --server`: the API has no ping of its own, so this reports each server's
/// last contact as the server recorded it (its runs and imports keep it current); a server
/// is up when its last contact succeeded.
async fn health_from(cx: &Context, server: &crate::client::ApiClient) -> anyhow::Result<ExitCode> {
    let servers = servers_from(server).await?;
    if servers.is_empty() {
        bail!("the server at --server has no MCP servers configured");
    }
    let mut all_up = true;
    let rows: Vec<Value> = servers
        .iter()
        .map(|s| {
            // RFC 3339 UTC with milliseconds: the text order is the time order.
            let up = match (s["last_success"].as_str(), s["last_failure"].as_str()) {
                (Some(success), Some(failure)) => success >= failure,
                (Some(_), None) => true,
                (None, _) => false,
            };
            all_up &= up;
            serde_json::json!({
                "server": s["name"], "up": up, "last_success": s["last_success"],
                "last_failure": s["last_failure"], "error": if up { Value::Null } else { s["last_error"].clone() },
            })
        })
        .collect();
    output::emit(cx.json, &rows, || {
        rows.iter()
            .zip(&servers)
            .map(|(row, s)| {
                let state = if row["up"] == true { "up" } else { "DOWN" };
                format!(
                    "{}: {state} at its last contact; {}",
                    row["server"].as_str().unwrap_or_default(),
                    contact_text(s)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn health(cx: &Context) -> anyhow::Result<ExitCode> {
    if let Some(server) = &cx.server {
        return health_from(cx, server).await;
    }
    if cx.config.mcp_servers.is_empty() {
        bail!("no MCP servers configured: add one with `runwarden mcp add NAME URL`");
    }
    let stop = ctrl_c_flag();
    let mut rows = Vec::new();
    let mut all_up = true;
    for server in cx.config.mcp_servers.values() {
        let (client, _) = client(cx, server).await?;
        let started = std::time::Instant::now();
        let reply = client.send_request(Request::Health, Some(&stop)).await;
        let trail = client.last_request();
        let protocol = trail.as_ref().and_then(|t| t.protocol.clone());
        let probe = match &reply {
            Ok(Reply::Alive { probe, .. }) => Some(probe.clone()),
            _ => None,
        };
        let error = reply
            .as_ref()
            .err()
            .map(|e| format!("{e} {}", trail.as_ref().map_or("", |t| t.trail.as_str())));
        all_up &= error.is_none();
        rows.push(serde_json::json!({
            "server": server.name, "up": error.is_none(), "protocol": protocol, "probe": probe,
            "millis": started.elapsed().as_millis() as u64, "error": error,
        }));
    }
    let store = cx.root.catalogue().await?;
    let health = store.health_list().await?;
    output::emit(cx.json, &rows, || {
        rows.iter()
            .map(|r| {
                let name = r["server"].as_str().unwrap_or_default();
                let state = match r["error"].as_str() {
                    None => format!(
                        "up at protocol {} ({} answered in {} ms)",
                        r["protocol"].as_str().unwrap_or("?"),
                        r["probe"].as_str().unwrap_or("?"),
                        r["millis"]
                    ),
                    Some(e) => format!("DOWN: {e}"),
                };
                format!(
                    "{name}: {state}; {}",
                    contact_line(health.iter().find(|h| h.server == name))
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The operator's prepared answer to a server's question during `mcp call`.
struct PreparedAnswer(Map<String, Value>);

impl Elicitor for PreparedAnswer {
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture {
        let answer = answer_with_defaults(&self.0, &request.requested_schema);
        Box::pin(async move { answer })
    }
}

/// The prepared answer completed with the defaults the requested schema gives (SEP-1034),
/// kept to the fields the schema names. A required field with neither an answer nor a
/// default cannot be answered: the question is declined.
fn answer_with_defaults(prepared: &Map<String, Value>, schema: &Value) -> ElicitationAnswer {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut content = Map::new();
    for (field, property) in properties {
        if let Some(value) = prepared.get(field).or_else(|| property.get("default")) {
            content.insert(field.clone(), value.clone());
        }
    }
    let required = schema.get("required").and_then(Value::as_array);
    let missing = required
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|field| !content.contains_key(field));
    if missing {
        ElicitationAnswer::Decline
    } else {
        ElicitationAnswer::Accept(content)
    }
}

fn json_object(flag: &str, text: &str) -> anyhow::Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => bail!("{flag} must be a JSON object, like '{{\"q\": \"printer\"}}'"),
        Err(e) => {
            bail!("{flag} is not valid JSON ({e}): pass an object, like '{{\"q\": \"printer\"}}'")
        }
    }
}

/// The entry `tool` names, by its local name or else its remote one.
fn find_entry<'a>(catalogue: &'a [CatalogueEntry], tool: &str) -> Option<&'a CatalogueEntry> {
    catalogue
        .iter()
        .find(|e| e.local_name == tool)
        .or_else(|| catalogue.iter().find(|e| e.remote_name == tool))
}

async fn call(
    cx: &Context,
    name: &str,
    tool: &str,
    args: &str,
    answer: Option<&str>,
    force: bool,
) -> anyhow::Result<ExitCode> {
    let server = cx.config.mcp_server(name)?;
    let arguments = json_object("--args", args)?;
    let elicitor = match answer {
        Some(text) => Some(ElicitorHandle(Arc::new(PreparedAnswer(json_object(
            "--answer", text,
        )?)))),
        None => None,
    };
    let (client, store) = client(cx, server).await?;
    let stop = ctrl_c_flag();
    // The call is checked against the imported catalogue, or, for a server never
    // imported, its tools listed now; `--force` skips the check (and that listing).
    let catalogue = if force {
        store.catalogue_list(Some(name)).await?
    } else {
        match mcp_refusal::catalogue_for_call(store.as_ref(), &client, server, &stop).await {
            Ok((catalogue, source)) => {
                let entry = find_entry(&catalogue, tool);
                mcp_refusal::refuse_locally(name, tool, entry, &catalogue, source)?;
                catalogue
            }
            Err(error) => match error.into_error(name) {
                Ok(error) => return Err(error),
                Err(cancelled) => {
                    output::error(cx.json, &anyhow::anyhow!("cancelled: {cancelled}"));
                    return Ok(ExitCode::from(EXIT_CANCELLED));
                }
            },
        }
    };
    // A local name from the catalogue maps to its remote name; anything else goes as is.
    let entry = find_entry(&catalogue, tool);
    let remote = entry.map_or(tool, |e| e.remote_name.as_str()).to_string();
    let request = McpCall {
        tool: remote.clone(),
        arguments,
        correlation: None,
        gate: None,
        // M14: only what the operator prepared on the command line; else a decline.
        elicitor,
        // No one to sample for on the command line: refused.
        sampler: None,
        // M7 (amended): an imported tool's results are checked against its outputSchema.
        output_schema: entry.and_then(|e| e.output_schema.clone()),
        notices: None,
        // M19: an `input_required` result is answered from the command line at once.
        park_on_input: false,
        resume: None,
        // Past the local refusal: the audit rows say the operator forced it.
        forced: force && !entry.is_some_and(CatalogueEntry::is_usable),
    };
    let outcome = client.call_tool(request, Some(&stop)).await;
    let result = &outcome.result;
    let (label, code) = match result.outcome {
        ToolOutcome::Succeeded => ("succeeded", ExitCode::SUCCESS),
        ToolOutcome::ToolError => ("tool error", ExitCode::FAILURE),
        ToolOutcome::Failed => ("failed", ExitCode::FAILURE),
        ToolOutcome::Cancelled => ("cancelled", ExitCode::from(EXIT_CANCELLED)),
    };
    let legs: Vec<Value> = outcome
        .legs
        .iter()
        .map(|l| serde_json::json!({"method": l.method, "granted_ms": l.granted.as_millis() as u64, "millis": l.elapsed.as_millis() as u64, "audit_id": l.audit_id}))
        .collect();
    let report = serde_json::json!({
        "server": name, "tool": remote, "outcome": label, "text": result.text, "structured": result.structured,
        "sent": result.sent(), "delivery": result.delivery.as_str(), "request_id": outcome.request_id, "legs": legs,
    });
    output::emit(cx.json, &report, || {
        let total: u128 = outcome.legs.iter().map(|l| l.elapsed.as_millis()).sum();
        let legs = output::count(outcome.legs.len() as u64, "leg", "legs");
        let mut text = format!(
            "{}\n{label}: {name} {remote} ({legs}, {total} ms)",
            result.text
        );
        if result.outcome == ToolOutcome::Cancelled {
            let effect = if result.sent() {
                "the request had gone out: its effect on the server is unknown"
            } else {
                "nothing was sent"
            };
            text.push_str(&format!(
                "\ncancelled by Ctrl-C; {effect}; see `runwarden audit list`"
            ));
        }
        text
    });
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_prepared_answer_takes_the_questions_defaults_for_what_it_leaves_out() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "note": {"type": "string"}
        }, "required": []});
        let prepared = json!({"age": 41, "unasked": true});
        let answer = answer_with_defaults(prepared.as_object().unwrap(), &schema);
        let expected = json!({"name": "John Doe", "age": 41});
        assert_eq!(
            answer,
            ElicitationAnswer::Accept(expected.as_object().unwrap().clone())
        );
    }

    #[test]
    fn a_required_field_with_no_answer_and_no_default_declines() {
        let schema = json!({"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]});
        assert_eq!(
            answer_with_defaults(&Map::new(), &schema),
            ElicitationAnswer::Decline
        );
    }
}
