//! `runwarden mcp add|remove`: declare or drop an MCP server by editing the configuration
//! file in place. toml_edit keeps the operator's comments, order and formatting; the edited
//! text is checked by the same loader every command uses before it replaces the file,
//! atomically (a temporary file in the same directory, then a rename) and with its mode.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use toml_edit::{DocumentMut, InlineTable, Item, Table, value};

use super::Context;
use super::egress::PlacementKind;
use crate::config::Config;
use crate::output;

#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The server's name: its tools become NAME__TOOL.
    name: String,
    /// Its Streamable HTTP endpoint, like https://mcp.example.com/mcp (or, for a local
    /// server, the command after `--`).
    url: Option<String>,
    /// A local server: the program and its arguments, after `--`
    /// (`runwarden mcp add files -- npx -y @modelcontextprotocol/server-filesystem /srv`).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
    /// A local server's environment variable, NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// A local server's environment variable from a vault secret, NAME=SECRET (repeatable).
    #[arg(long = "env-secret", value_name = "NAME=SECRET")]
    env_secret: Vec<String>,
    /// A local server's sandbox: namespace [default] or none (the host's network,
    /// unaudited).
    #[arg(long, value_name = "MODE")]
    sandbox: Option<String>,
    /// A vault secret placed on every request to it (`runwarden secret put S` first).
    #[arg(long, value_name = "S", requires = "placement")]
    auth_secret: Option<String>,
    /// Where the secret goes.
    #[arg(long, value_name = "P", requires = "auth_secret")]
    placement: Option<PlacementKind>,
    /// The header name, for --placement header.
    #[arg(long, requires = "auth_secret")]
    header: Option<String>,
    /// Text before the secret, for --placement header (e.g. "Token ").
    #[arg(long, requires = "auth_secret")]
    prefix: Option<String>,
    /// The query parameter, for --placement query.
    #[arg(long, requires = "auth_secret")]
    param: Option<String>,
    /// The default effect of its tools: read_only, idempotent_write or
    /// non_idempotent_write [default: non_idempotent_write].
    #[arg(long, value_name = "E")]
    effect: Option<String>,
    /// One budget per operation in seconds, spent across its HTTP legs [default: 20].
    #[arg(long, value_name = "S")]
    timeout: Option<f64>,
}

/// The configuration file to edit: it must exist (`init` creates one), and a symbolic link
/// is followed so the link stays a link.
fn config_file(cx: &Context) -> anyhow::Result<PathBuf> {
    let path = &cx.config.path;
    if !path.exists() {
        bail!(
            "there is no configuration file at {}: create one with `runwarden init`",
            path.display()
        );
    }
    std::fs::canonicalize(path).with_context(|| format!("while resolving {}", path.display()))
}

fn read_document(path: &Path) -> anyhow::Result<DocumentMut> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("while reading the configuration {}", path.display()))?;
    text.parse::<DocumentMut>()
        .with_context(|| format!("while reading the configuration {}", path.display()))
}

/// `[mcp.servers]` of the document, created (as implicit tables, so no empty `[mcp]`
/// header appears) when `create` is set.
fn servers_table<'d>(
    document: &'d mut DocumentMut,
    path: &Path,
    create: bool,
) -> anyhow::Result<Option<&'d mut Table>> {
    let not_a_table = || {
        anyhow::anyhow!(
            "{}: mcp.servers is not a table: write each server as [mcp.servers.NAME]",
            path.display()
        )
    };
    if !create && document.get("mcp").is_none() {
        return Ok(None);
    }
    let mcp = document.entry("mcp").or_insert_with(|| {
        let mut table = Table::new();
        table.set_implicit(true);
        Item::Table(table)
    });
    let mcp = mcp.as_table_mut().ok_or_else(not_a_table)?;
    if !create && mcp.get("servers").is_none() {
        return Ok(None);
    }
    let servers = mcp.entry("servers").or_insert_with(|| {
        let mut table = Table::new();
        table.set_implicit(true);
        Item::Table(table)
    });
    Ok(Some(servers.as_table_mut().ok_or_else(not_a_table)?))
}

/// Checks `text` with the loader every command uses, then puts it in place of `path`
/// atomically, with the file's mode. On any error the file is left as it was.
fn replace_checked(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;

    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut staged = tempfile::Builder::new()
        .prefix(".runwarden.toml.")
        .tempfile_in(dir)
        .with_context(|| format!("while creating a temporary file in {}", dir.display()))?;
    staged
        .write_all(text.as_bytes())
        .and_then(|()| staged.as_file().sync_all())
        .context("while writing the edited configuration")?;
    // The same rules as loading; relative paths resolve alike (same directory).
    Config::load(staged.path())?;
    let permissions = std::fs::metadata(path)
        .with_context(|| format!("while reading the mode of {}", path.display()))?
        .permissions();
    std::fs::set_permissions(staged.path(), permissions)
        .context("while giving the edited configuration the file's mode")?;
    staged
        .persist(path)
        .with_context(|| format!("while replacing {}", path.display()))?;
    Ok(())
}

/// Calls `each` with every table of `table`, nested ones included, in no set order.
fn visit_tables(table: &mut Table, each: &mut dyn FnMut(&mut Table)) {
    for (_, item) in table.iter_mut() {
        match item {
            Item::Table(inner) => {
                each(inner);
                visit_tables(inner, each);
            }
            Item::ArrayOfTables(array) => {
                for inner in array.iter_mut() {
                    each(inner);
                    visit_tables(inner, each);
                }
            }
            _ => {}
        }
    }
}

/// The text above a removed table (comments that may be about the tables before it, like
/// the template's commented-out settings) moves to the table that followed it, or to the
/// end of the file: removing a server never deletes an operator's comments.
fn keep_comments_above(document: &mut DocumentMut, removed: &Table) {
    let above = removed
        .decor()
        .prefix()
        .and_then(|p| p.as_str())
        .unwrap_or_default()
        .trim()
        .to_string();
    if above.is_empty() {
        return;
    }
    let Some(at) = removed.position() else {
        return;
    };
    let mut next: Option<isize> = None;
    visit_tables(document.as_table_mut(), &mut |table| {
        if let Some(p) = table.position().filter(|p| *p > at && !table.is_implicit()) {
            next = Some(next.map_or(p, |n| n.min(p)));
        }
    });
    match next {
        Some(next) => visit_tables(document.as_table_mut(), &mut |table| {
            if table.position() == Some(next) {
                let own = table
                    .decor()
                    .prefix()
                    .and_then(|p| p.as_str())
                    .unwrap_or_default()
                    .to_string();
                table.decor_mut().set_prefix(format!("{above}\n{own}"));
            }
        }),
        None => {
            let trailing = document.trailing().as_str().unwrap_or_default().to_string();
            document.set_trailing(format!("{above}\n{trailing}"));
        }
    }
}

pub(crate) fn add(cx: &Context, args: AddArgs) -> anyhow::Result<ExitCode> {
    let path = config_file(cx)?;
    let mut document = read_document(&path)?;
    let name = args.name.clone();
    let servers = servers_table(&mut document, &path, true)?
        .context("the [mcp.servers] table was just created")?;
    if servers.contains_key(&name) {
        bail!(
            "an MCP server named {name:?} is already in {}: pick another name, or `runwarden mcp remove {name}` first",
            path.display()
        );
    }
    let mut server = Table::new();
    match (&args.url, args.command.split_first()) {
        (Some(url), None) => {
            server["url"] = value(url.clone());
            if !args.env.is_empty() || !args.env_secret.is_empty() || args.sandbox.is_some() {
                bail!(
                    "--env, --env-secret and --sandbox are for a local server, given as a command after --"
                );
            }
        }
        (None, Some((program, rest))) => local_server(&mut server, program, rest, &args)?,
        (Some(_), Some(_)) => bail!(
            "give either a URL (a server reached over HTTP) or a command after -- (a local server), not both"
        ),
        (None, None) => bail!(
            "give the server's URL (`runwarden mcp add NAME https://...`) or, for a local server, its command after -- (`runwarden mcp add NAME -- program args`)"
        ),
    }
    if let (Some(secret), Some(kind)) = (&args.auth_secret, args.placement) {
        let mut auth = InlineTable::new();
        auth.insert("secret", secret.as_str().into());
        let placement = kind
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        auth.insert("placement", placement.into());
        for (key, text) in [
            ("header", &args.header),
            ("prefix", &args.prefix),
            ("param", &args.param),
        ] {
            if let Some(text) = text {
                auth.insert(key, text.as_str().into());
            }
        }
        server["auth"] = value(auth);
    }
    if let Some(effect) = &args.effect {
        server["effect"] = value(effect.as_str());
    }
    if let Some(timeout) = args.timeout {
        // A whole number is written as one (`20`, not `20.0`), as an operator would.
        server["timeout_seconds"] = if timeout.fract() == 0.0 && timeout.abs() < 1e9 {
            value(timeout as i64)
        } else {
            value(timeout)
        };
    }
    servers.insert(&name, Item::Table(server));
    // The new table goes last. Comments after the file's last key (the template's
    // commented-out settings) are the document's trailing text: they stay above the new
    // table, where they were, instead of ending up below its keys as if they were its own.
    let trailing = document
        .trailing()
        .as_str()
        .unwrap_or_default()
        .trim_end()
        .to_string();
    document.set_trailing("");
    if let Some(table) = document["mcp"]["servers"][&name].as_table_mut() {
        let blank = if trailing.is_empty() { "\n" } else { "\n\n" };
        table.decor_mut().set_prefix(format!("{trailing}{blank}"));
    }
    replace_checked(&path, &document.to_string()).with_context(|| {
        format!(
            "server {name} was not added; {} is unchanged",
            path.display()
        )
    })?;
    let report = match &args.url {
        Some(url) => serde_json::json!({ "added": name, "url": url, "config": path }),
        None => serde_json::json!({ "added": name, "command": args.command, "config": path }),
    };
    output::emit(cx.json, &report, || {
        format!(
            "added MCP server {name} to {}; import its tools with `runwarden mcp import {name}`",
            path.display()
        )
    });
    Ok(ExitCode::SUCCESS)
}

/// The keys of a local server: its command, arguments, environment and sandbox.
fn local_server(
    server: &mut Table,
    program: &str,
    rest: &[String],
    args: &AddArgs,
) -> anyhow::Result<()> {
    server["command"] = value(program);
    if !rest.is_empty() {
        let mut list = toml_edit::Array::new();
        list.extend(rest.iter().map(String::as_str));
        server["args"] = value(list);
    }
    let mut env = InlineTable::new();
    for entry in &args.env {
        let (name, text) = entry
            .split_once('=')
            .with_context(|| format!("--env {entry:?}: write it as NAME=VALUE"))?;
        env.insert(name, text.into());
    }
    for entry in &args.env_secret {
        let (name, secret) = entry
            .split_once('=')
            .with_context(|| format!("--env-secret {entry:?}: write it as NAME=SECRET"))?;
        let mut reference = InlineTable::new();
        reference.insert("secret", secret.into());
        env.insert(name, toml_edit::Value::InlineTable(reference));
    }
    if !env.is_empty() {
        server["env"] = value(env);
    }
    if let Some(sandbox) = &args.sandbox {
        server["sandbox"] = value(sandbox.as_str());
    }
    Ok(())
}

pub(crate) fn remove(cx: &Context, name: &str) -> anyhow::Result<ExitCode> {
    let path = config_file(cx)?;
    let mut document = read_document(&path)?;
    let servers = servers_table(&mut document, &path, false)?;
    let removed = servers.and_then(|servers| servers.remove(name));
    if let Some(Item::Table(table)) = &removed {
        keep_comments_above(&mut document, table);
    }
    if removed.is_none() {
        let known: Vec<&str> = cx.config.mcp_servers.keys().map(String::as_str).collect();
        if known.is_empty() {
            bail!(
                "no MCP server named {name:?} in {}: none is configured",
                path.display()
            );
        }
        bail!(
            "no MCP server named {name:?} in {}: the configured ones are {}",
            path.display(),
            known.join(", ")
        );
    }
    replace_checked(&path, &document.to_string()).with_context(|| {
        format!(
            "server {name} was not removed; {} is unchanged",
            path.display()
        )
    })?;
    // Agents that name the server's tools keep their patterns: say which, so the operator
    // can edit them (a pattern that matches nothing binds no tool).
    let prefix = format!("{name}__");
    let users: Vec<&str> = cx
        .config
        .agents
        .values()
        .filter(|agent| agent.tools.iter().any(|t| t.starts_with(&prefix)))
        .map(|agent| agent.name.as_str())
        .collect();
    let report =
        serde_json::json!({ "removed": name, "config": path, "agents_naming_its_tools": users });
    output::emit(cx.json, &report, || {
        let mut text = format!("removed MCP server {name} from {}", path.display());
        if !users.is_empty() {
            text.push_str(&format!(
                "\nthese agents still list its tools ({prefix}...): {}",
                users.join(", ")
            ));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}
