//! `runwarden backup DEST`: a consistent copy of the SQLite database taken while the
//! installation runs (SQLite's online backup API), its audit anchor beside it, and the
//! files the operator must keep with it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::json;

use super::Context;
use crate::store_url::StoreUrl;

/// Pages copied per step of the backup; between steps writers may go on.
const PAGES_PER_STEP: i32 = 256;

#[derive(Debug, clap::Args)]
pub(crate) struct BackupArgs {
    /// The copy to write: a new file (an existing one is refused). The audit anchor is
    /// copied beside it as DEST.anchor.
    dest: PathBuf,
}

/// What one backup wrote.
struct Copied {
    pages: i32,
    anchor: Option<PathBuf>,
}

pub(crate) async fn run(cx: &Context, args: BackupArgs) -> anyhow::Result<ExitCode> {
    let StoreUrl::Sqlite(source) = &cx.config.store else {
        bail!(
            "backup copies the SQLite database; this installation uses PostgreSQL: back it up with pg_dump (or your server's backups), and keep the master key file beside it"
        );
    };
    if !source.exists() {
        bail!(
            "there is no database at {}: nothing to back up (run `runwarden init` to create one)",
            source.display()
        );
    }
    if args.dest.exists() {
        bail!(
            "{} exists: name a new file, the backup never overwrites one",
            args.dest.display()
        );
    }
    let (from, to, anchor) = (
        source.clone(),
        args.dest.clone(),
        cx.config.audit_anchor_file.clone(),
    );
    let copied = tokio::task::spawn_blocking(move || copy(&from, &to, &anchor)).await??;
    let key = if crate::config::master_key_from_env() {
        "the master key you set in RUNWARDEN_MASTER_KEY".to_string()
    } else {
        format!(
            "the master key file {}",
            cx.config.master_key_file.display()
        )
    };
    let anchor_note = match &copied.anchor {
        Some(path) => format!("the audit anchor copied to {}", path.display()),
        None => "no audit anchor file existed to copy".to_string(),
    };
    crate::output::emit(
        cx.json,
        &json!({
            "backup": args.dest,
            "source": source,
            "pages": copied.pages,
            "integrity": "ok",
            "anchor": copied.anchor,
            "master_key_file": (!crate::config::master_key_from_env()).then_some(&cx.config.master_key_file),
        }),
        || {
            format!(
                "backed up {} to {} ({} pages, integrity ok)\nkeep beside it: {key} (without it no secret in the copy can be read) and {anchor_note} (`audit verify` checks the copy against it); store the key apart from the copy",
                source.display(),
                args.dest.display(),
                copied.pages,
            )
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// Copies the anchor first (so it never records more of the audit chain than the copy
/// holds), then the database page by page with SQLite's backup API, then checks the copy.
fn copy(source: &Path, dest: &Path, anchor: &Path) -> anyhow::Result<Copied> {
    let anchor_copy = if anchor.exists() {
        let mut name = dest.as_os_str().to_owned();
        name.push(".anchor");
        let target = PathBuf::from(name);
        std::fs::copy(anchor, &target)
            .with_context(|| format!("copying the audit anchor to {}", target.display()))?;
        private(&target)?;
        Some(target)
    } else {
        None
    };
    let from = rusqlite::Connection::open_with_flags(
        source,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} to back it up", source.display()))?;
    from.busy_timeout(Duration::from_secs(5))?;
    let mut to = rusqlite::Connection::open(dest)
        .with_context(|| format!("creating the backup {}", dest.display()))?;
    private(dest)?;
    let pages = {
        let backup = rusqlite::backup::Backup::new(&from, &mut to)?;
        backup
            .run_to_completion(PAGES_PER_STEP, Duration::from_millis(5), None)
            .with_context(|| format!("copying {} to {}", source.display(), dest.display()))?;
        backup.progress().pagecount
    };
    let check: String = to.query_row("PRAGMA quick_check", [], |row| row.get(0))?;
    if check != "ok" {
        bail!(
            "the copy at {} failed its integrity check ({check}): the source may be damaged; run `runwarden doctor`",
            dest.display()
        );
    }
    Ok(Copied {
        pages,
        anchor: anchor_copy,
    })
}

/// Mode 0600: the copy holds sealed secrets and the audit log.
fn private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private (mode 0600)", path.display()))
}
