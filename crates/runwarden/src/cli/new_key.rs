//! `runwarden init --new-key`: start over after the master key was lost. The old database,
//! audit anchor and (wrong) key are kept beside the new ones, renamed `*.closed-TIME`, with
//! a note saying what happened; their audit log stays readable as history. Then `init`
//! creates a new key, vault and audit chain.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use runwarden_vault::Vault;

use crate::config::Config;
use crate::key_advice::installed;
use crate::root::Backend;

/// What a person types to confirm on a terminal.
const CONFIRMATION: &str = "start over";

/// Checks that there is something to start over from and that the key really is lost,
/// asks for the confirmation, and moves the old history aside. Returns the files kept.
pub(crate) async fn close_old_installation(
    config: &Config,
    yes: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    if !installed(config) {
        bail!(
            "there is no installation at {} to start over from: run `runwarden init`",
            config.data_dir.display()
        );
    }
    let Some(database) = config.store.sqlite_path() else {
        bail!(
            "--new-key closes a SQLite installation; with PostgreSQL, create a new database, point \
             [store] url (or $RUNWARDEN_DATABASE_URL) at it, move {} aside and run `runwarden init`",
            config.audit_anchor_file.display()
        );
    };
    if key_still_opens(config).await {
        bail!(
            "the master key at {} opens this installation: nothing is lost, so there is nothing to \
             start over from (to change the key, use `runwarden secret rotate-master-key`)",
            config.master_key_file.display()
        );
    }
    confirm(yes)?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let mut kept = Vec::new();
    let closed_database = format!("{}.closed-{stamp}", database.display());
    // SQLite finds a database's write-ahead log by name: `X-wal` goes with `X`.
    let renames = [
        (database.to_path_buf(), closed_database.clone()),
        (suffixed(database, "-wal"), format!("{closed_database}-wal")),
        (suffixed(database, "-shm"), format!("{closed_database}-shm")),
        (
            config.audit_anchor_file.clone(),
            format!("{}.closed-{stamp}", config.audit_anchor_file.display()),
        ),
        (
            config.master_key_file.clone(),
            format!("{}.closed-{stamp}", config.master_key_file.display()),
        ),
    ];
    for (path, closed) in renames {
        if path.exists() {
            let closed = PathBuf::from(closed);
            std::fs::rename(&path, &closed)
                .with_context(|| format!("while moving {} aside", path.display()))?;
            kept.push(closed);
        }
    }
    let note = config.data_dir.join(format!("CLOSED-{stamp}.txt"));
    std::fs::write(&note, note_text(&stamp, &kept))
        .with_context(|| format!("while writing {}", note.display()))?;
    kept.push(note);
    Ok(kept)
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", path.display()))
}

/// Whether the configured key (still) opens the vault: then nothing is lost.
async fn key_still_opens(config: &Config) -> bool {
    let Ok(key) = config.master_key() else {
        return false;
    };
    let Ok(backend) = Backend::open(config, false).await else {
        return false;
    };
    Vault::open(backend.store(), key, config.algorithm)
        .await
        .is_ok()
}

/// `--yes`, or the confirmation typed on a terminal.
fn confirm(yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "--new-key closes this installation's history and makes its secrets unreadable for \
             good: confirm with --yes (or run it on a terminal to be asked)"
        );
    }
    eprint!(
        "This closes the installation's history (kept beside it as *.closed-TIME files) and \
         starts a new key, vault and audit chain; the old secrets stay unreadable.\n\
         Type `{CONFIRMATION}` to go on: "
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if answer.trim() != CONFIRMATION {
        bail!("not confirmed: nothing was changed");
    }
    Ok(())
}

fn note_text(stamp: &str, kept: &[PathBuf]) -> String {
    let files: Vec<String> = kept.iter().map(|p| format!("  {}", p.display())).collect();
    let database = kept
        .first()
        .map_or(Path::new("").display(), |p| p.display());
    format!(
        "Closed at {stamp} by `runwarden init --new-key`: the master key was missing or wrong.\n\
         These files are the installation as it was, kept as history:\n{}\n\
         Its audit log is plain rows, readable without the key, e.g.\n  \
         sqlite3 {database} 'SELECT id, time_ms, action, host, path, status, actor FROM audit_log'\n\
         Its secrets were sealed under the lost key and cannot be read. A new key, vault and \
         audit chain start beside it.\n",
        files.join("\n")
    )
}
