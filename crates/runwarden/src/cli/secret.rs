//! `runwarden secret`: put (value from stdin only), list, rm, rotate-master-key.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use runwarden_vault::{MasterKey, SecretName, SecretValue, Vault};
use serde::Serialize;
use zeroize::Zeroizing;

use super::Context;
use crate::config::{MASTER_KEY_ENV, master_key_from_env};
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum SecretCommand {
    /// Store a secret; the value is read from standard input, never from arguments.
    Put {
        /// The secret's name (A-Z a-z 0-9 . _ -).
        name: String,
    },
    /// List secrets: names and times, never values.
    List,
    /// Remove a secret.
    Rm {
        /// The secret's name.
        name: String,
    },
    /// Re-wrap every secret under a new master key, atomically.
    RotateMasterKey {
        /// The new key file (64 hex characters, mode 0600); created with a fresh key if
        /// it does not exist.
        #[arg(long, value_name = "PATH")]
        new_key_file: PathBuf,
    },
}

pub(crate) async fn run(cx: &Context, command: SecretCommand) -> anyhow::Result<ExitCode> {
    match command {
        SecretCommand::Put { name } => put(cx, &name).await,
        SecretCommand::List => list(cx).await,
        SecretCommand::Rm { name } => remove(cx, &name).await,
        SecretCommand::RotateMasterKey { new_key_file } => rotate(cx, &new_key_file).await,
    }
}

/// Reads the value from stdin, dropping one trailing newline (what `echo` and editors add).
fn read_value() -> anyhow::Result<SecretValue> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("reading the secret value from standard input; end with Ctrl-D");
    }
    let mut bytes = Zeroizing::new(Vec::new());
    stdin
        .read_to_end(&mut bytes)
        .context("while reading the secret value from standard input")?;
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    Ok(SecretValue::new(std::mem::take(&mut *bytes)))
}

async fn put(cx: &Context, name: &str) -> anyhow::Result<ExitCode> {
    let name = SecretName::new(name)?;
    let vault = cx.vault().await?;
    let value = read_value()?;
    let existed = vault.secret_exists(&name).await?;
    vault.secret_put(&name, value).await?;
    let verb = if existed { "updated" } else { "stored" };
    output::emit(
        cx.json,
        &serde_json::json!({ "name": name.as_str(), "result": verb }),
        || format!("{verb} secret {name}"),
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct Listed {
    name: String,
    algorithm: String,
    created: String,
    updated: String,
}

async fn list(cx: &Context) -> anyhow::Result<ExitCode> {
    let vault = cx.vault().await?;
    let secrets: Vec<Listed> = vault
        .secret_list()
        .await?
        .into_iter()
        .map(|m| Listed {
            name: m.name,
            algorithm: m.algorithm,
            created: output::time(m.created_ms),
            updated: output::time(m.updated_ms),
        })
        .collect();
    output::emit(cx.json, &secrets, || {
        if secrets.is_empty() {
            return "no secrets; store one with `runwarden secret put NAME < value-file`".into();
        }
        let mut text = format!(
            "{:<32} {:<18} {:<25} {}",
            "NAME", "ALGORITHM", "CREATED", "UPDATED"
        );
        for s in &secrets {
            text.push_str(&format!(
                "\n{:<32} {:<18} {:<25} {}",
                s.name, s.algorithm, s.created, s.updated
            ));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}

async fn remove(cx: &Context, name: &str) -> anyhow::Result<ExitCode> {
    let name = SecretName::new(name)?;
    let vault = cx.vault().await?;
    if !vault.secret_remove(&name).await? {
        bail!(
            "no secret named {:?}: `runwarden secret list` shows what is stored",
            name.as_str()
        );
    }
    output::emit(
        cx.json,
        &serde_json::json!({ "name": name.as_str(), "result": "removed" }),
        || format!("removed secret {name}"),
    );
    Ok(ExitCode::SUCCESS)
}

/// Copies `from` over `to` atomically: a temporary file in `to`'s folder, then a rename.
fn install_key_file(from: &Path, to: &Path) -> anyhow::Result<()> {
    let dir = to
        .parent()
        .context("the master key file has no parent folder")?;
    let key = MasterKey::from_file(from)?;
    let temp = dir.join(format!(".master.key.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    key.write_new_file(&temp)?;
    std::fs::rename(&temp, to)?;
    Ok(())
}

async fn rotate(cx: &Context, new_key_file: &Path) -> anyhow::Result<ExitCode> {
    let vault = match cx.vault().await {
        Ok(vault) => vault,
        // A rotation stopped after its commit and before the new key was installed: the
        // configured key opens nothing any more, the new one opens everything. Running the
        // command again finishes it.
        Err(error) => match finishes_a_stopped_rotation(cx, new_key_file).await {
            Some(key) => return installed(cx, new_key_file, &key, None, false),
            None => return Err(error),
        },
    };
    let created = !new_key_file.exists();
    if created {
        MasterKey::generate()
            .write_new_file(new_key_file)
            .with_context(|| format!("while writing the new key {}", new_key_file.display()))?;
    }
    let new_key = MasterKey::from_file(new_key_file)?;
    if new_key.id() == vault.master_key_id() {
        bail!("the new key is the key in use: give a different key file");
    }
    // V1: one store transaction re-wraps every data key; an interruption leaves every
    // record under exactly one of the two keys.
    let count = vault
        .rotate_master_key(&new_key)
        .await
        .context("while re-wrapping the data keys (nothing was changed)")?;
    // Prove the new key opens the vault before anything points at it.
    let store = cx.root.vault_store().await?;
    Vault::open(
        store,
        MasterKey::from_file(new_key_file)?,
        cx.config.algorithm,
    )
    .await
    .context("the rotation committed but the new key does not open the vault")?;

    installed(cx, new_key_file, &new_key, Some(count), created)
}

/// The key in `new_key_file` when it opens the vault (the rewrap committed under it).
async fn finishes_a_stopped_rotation(cx: &Context, new_key_file: &Path) -> Option<MasterKey> {
    let store = cx.root.vault_store().await.ok()?;
    let opening = MasterKey::from_file(new_key_file).ok()?;
    Vault::open(store, opening, cx.config.algorithm)
        .await
        .ok()?;
    MasterKey::from_file(new_key_file).ok()
}

/// Installs the new key where the configuration looks for it (unless the key comes from
/// the environment) and says what was done; `count` is `None` when this run only finished
/// a rotation that had stopped after re-wrapping.
fn installed(
    cx: &Context,
    new_key_file: &Path,
    new_key: &MasterKey,
    count: Option<usize>,
    created: bool,
) -> anyhow::Result<ExitCode> {
    let installed = if master_key_from_env() {
        false
    } else {
        install_key_file(new_key_file, &cx.config.master_key_file).with_context(|| {
            format!(
                "every secret is now under the key in {}, but it could not be copied to {}: point [vault] master_key_file at it",
                new_key_file.display(),
                cx.config.master_key_file.display()
            )
        })?;
        true
    };
    let report = serde_json::json!({
        "rewrapped": count,
        "finished_a_stopped_rotation": count.is_none(),
        "new_master_key_id": new_key.id(),
        "new_key_file": new_key_file.display().to_string(),
        "new_key_file_created": created,
        "installed_at": installed.then(|| cx.config.master_key_file.display().to_string()),
    });
    output::emit(cx.json, &report, || {
        let mut text = match count {
            Some(count) => format!(
                "re-wrapped {count} data keys under master key {}",
                new_key.id()
            ),
            None => format!(
                "finished a rotation that had stopped: every data key was already under master key {}",
                new_key.id()
            ),
        };
        if installed {
            text.push_str(&format!(
                "\ninstalled the new key at {}; the copy at {} may be moved to safe storage",
                cx.config.master_key_file.display(),
                new_key_file.display()
            ));
        } else {
            text.push_str(&format!(
                "\nset ${MASTER_KEY_ENV} to the key in {} before the next command",
                new_key_file.display()
            ));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}
