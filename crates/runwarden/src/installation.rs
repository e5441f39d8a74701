//! A new installation for a resolved configuration: the data directory, the master key,
//! the migrated database, the vault and its audit anchor.

use anyhow::{Context as _, bail};
use runwarden_vault::{MasterKey, Vault};

use crate::config::Config;
use crate::root::Backend;

/// What `init` creates for a resolved configuration: the data directory, a fresh master
/// key file (never replacing one), the migrated SQLite database and the vault over both.
/// `runwarden demo` makes its temporary installation with it too.
pub(crate) async fn create_installation(config: &Config) -> anyhow::Result<Vault> {
    if config.master_key_file.exists() {
        bail!(
            "a master key already exists at {}: init never replaces a key (to change it, use `runwarden secret rotate-master-key`)",
            config.master_key_file.display()
        );
    }
    if config.audit_anchor_file.exists() {
        bail!(
            "an audit anchor already exists at {}: it belongs to an earlier installation; if that installation's master key is lost, `runwarden init --new-key` starts over and keeps its history; otherwise move the anchor aside (or point [vault] audit_anchor_file elsewhere) before init",
            config.audit_anchor_file.display()
        );
    }
    private_dir(&config.data_dir)
        .with_context(|| format!("while creating {}", config.data_dir.display()))?;
    for note in crate::harden::tighten_installation(config) {
        eprintln!("warning: {note}");
    }
    if let Some(parent) = config.master_key_file.parent() {
        private_dir(parent).with_context(|| format!("while creating {}", parent.display()))?;
    }
    let key = MasterKey::generate();
    key.write_new_file(&config.master_key_file)
        .with_context(|| {
            format!(
                "while writing the master key {}",
                config.master_key_file.display()
            )
        })?;
    if let Some(parent) = config.store.sqlite_path().and_then(|path| path.parent()) {
        private_dir(parent).with_context(|| format!("while creating {}", parent.display()))?;
    }
    let backend = Backend::open(config, true).await?;
    let mut vault = Vault::open(backend.store(), key, config.algorithm)
        .await
        .context("while creating the vault")?
        .with_anchor(&config.audit_anchor_file);
    if let Some(witness) = &config.audit_witness {
        vault = vault.with_external_witness(witness);
    }
    if let Some(parent) = config.audit_anchor_file.parent() {
        private_dir(parent).with_context(|| format!("while creating {}", parent.display()))?;
    }
    // V7 (amended): the witness outside the database starts with the (empty) log.
    vault
        .audit_adopt_anchor()
        .await
        .context("while creating the audit anchor file")?;
    Ok(vault)
}

/// Creates a directory (and its missing parents) with mode 0700; an existing one is kept
/// as it is.
fn private_dir(path: &std::path::Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path)
}
