//! `runwarden token`: API bearer tokens with a role. A token is printed once at
//! creation; only its hash is stored.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Subcommand, ValueEnum};
use runwarden_vault::{Role, token_create};
use serde_json::json;

use super::Context;
use crate::output;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum RoleArg {
    /// May start and cancel runs, and read everything.
    Operator,
    /// May read runs, events, servers, the audit log and metrics.
    Viewer,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Operator => Role::Operator,
            RoleArg::Viewer => Role::Viewer,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token and print it once; only its hash is stored.
    Create {
        /// What the token may do.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// A name for people ("ci", "alice") [default: the role].
        #[arg(long)]
        name: Option<String>,
    },
    /// Every token's id, name, role and creation time (never a token).
    List,
    /// Revoke a token by id; requests carrying it get 401 from then on.
    Revoke {
        /// The id `token list` shows.
        id: String,
    },
}

pub(crate) async fn run(cx: &Context, command: TokenCommand) -> anyhow::Result<ExitCode> {
    let store = cx.root.tokens().await?;
    match command {
        TokenCommand::Create { role, name } => {
            let role = Role::from(role);
            let name = name.unwrap_or_else(|| role.as_str().to_string());
            if name.trim().is_empty() || name.chars().any(char::is_control) {
                bail!("a token's name must be non-empty printable text");
            }
            // Policies (`Token::"NAME"`) and limits (`[limits.tokens.NAME]`) name a token
            // by its name, so two live tokens never share one.
            if let Some(same) = store.token_list().await?.iter().find(|t| t.name == name) {
                bail!(
                    "a token named {name:?} exists ({}): choose another --name, or revoke it first with `runwarden token revoke {}`",
                    same.id,
                    same.id
                );
            }
            let now = chrono::Utc::now().timestamp_millis();
            let (value, record) = token_create(&*store, &name, role, now)
                .await
                .context("while storing the token")?;
            if cx.json {
                output::line(json!({
                    "token": value.expose(), "id": record.id, "name": record.name, "role": record.role.as_str(),
                }));
            } else {
                output::line(value.expose());
                eprintln!(
                    "token {} ({}, {}): shown once, only its hash is stored; send it as Authorization: Bearer <token>",
                    record.id,
                    record.name,
                    record.role.as_str()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::List => {
            let tokens = store.token_list().await?;
            let rows: Vec<serde_json::Value> = tokens
                .iter()
                .map(|t| json!({ "id": t.id, "name": t.name, "role": t.role.as_str(), "created": output::time(t.created_ms) }))
                .collect();
            output::emit(cx.json, &rows, || {
                if tokens.is_empty() {
                    return "no tokens: `runwarden token create --role viewer` makes one".into();
                }
                tokens
                    .iter()
                    .map(|t| {
                        format!(
                            "{}  {:<9} {}  created {}",
                            t.id,
                            t.role.as_str(),
                            t.name,
                            output::time(t.created_ms)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Revoke { id } => {
            if !store.token_revoke(&id).await? {
                bail!("no token with id {id}: `runwarden token list` shows the ids");
            }
            output::emit(cx.json, &json!({ "id": id, "revoked": true }), || {
                format!("revoked token {id}")
            });
            Ok(ExitCode::SUCCESS)
        }
    }
}
