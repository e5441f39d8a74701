//! `runwarden init`: the configuration file, the data directory, the database, the key.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use super::Context;
use crate::config::{Config, MASTER_KEY_ENV, TEMPLATE, master_key_from_env};
use crate::installation::create_installation;
use crate::output;

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Start over after the master key was lost: keep the old database, audit anchor and
    /// key beside the new ones as closed history, then create a new key, vault and audit
    /// chain. The old secrets stay unreadable. Asks for confirmation on a terminal.
    #[arg(long)]
    new_key: bool,
    /// Confirm --new-key without being asked.
    #[arg(long, requires = "new_key")]
    yes: bool,
}

#[derive(Serialize)]
struct Initialised {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    closed: Vec<String>,
    config: String,
    config_written: bool,
    data_dir: String,
    database: String,
    master_key_file: String,
    master_key_id: String,
    audit_anchor_file: String,
}

pub(crate) async fn run(cx: &Context, args: InitArgs) -> anyhow::Result<ExitCode> {
    if master_key_from_env() {
        bail!(
            "${MASTER_KEY_ENV} is set: init creates a key file, so unset it first (or skip init and keep using the variable)"
        );
    }
    let config_written = if cx.config.path.exists() {
        false
    } else {
        std::fs::write(&cx.config.path, TEMPLATE)
            .with_context(|| format!("while writing {}", cx.config.path.display()))?;
        true
    };
    // The file may have just been written: read it back so what we create is what it says.
    let config = Config::load(&cx.config.path)?;
    let closed = if args.new_key {
        super::new_key::close_old_installation(&config, args.yes).await?
    } else {
        Vec::new()
    };
    let vault = create_installation(&config).await?;

    let report = Initialised {
        closed: closed.iter().map(|p| p.display().to_string()).collect(),
        config: config.path.display().to_string(),
        config_written,
        data_dir: config.data_dir.display().to_string(),
        database: match config.store.sqlite_path() {
            Some(path) => path.display().to_string(),
            None => config.store.to_string(),
        },
        master_key_file: config.master_key_file.display().to_string(),
        master_key_id: vault.master_key_id().to_string(),
        audit_anchor_file: config.audit_anchor_file.display().to_string(),
    };
    output::emit(cx.json, &report, || {
        let config_line = if report.config_written {
            "wrote"
        } else {
            "kept existing"
        };
        let closed = if report.closed.is_empty() {
            String::new()
        } else {
            format!(
                "closed the old history, kept as:\n  {}\n",
                report.closed.join("\n  ")
            )
        };
        format!(
            "{closed}{config_line} {}\ncreated {}\ncreated master key {} (id {}); back it up: without it no secret can be read\ncreated audit anchor {} (the audit log's witness: never restore it together with an older database)",
            report.config,
            report.database,
            report.master_key_file,
            report.master_key_id,
            report.audit_anchor_file
        )
    });
    Ok(ExitCode::SUCCESS)
}
