//! `runwarden doctor`: checks an installation (the database's integrity, free space, file
//! modes, the master key and the audit anchor, the WAL, tool settings, workers, the store)
//! and says what to do about each problem. Exit 1 when any check finds a problem.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::Context;
use crate::store_url::StoreUrl;

/// Less free space than this is a problem: SQLite needs room for its WAL and a checkpoint.
const LOW_SPACE: u64 = 64 << 20;
/// A WAL larger than this is worth a note: a long reader keeps checkpoints from finishing.
const LARGE_WAL: u64 = 256 << 20;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Ok,
    /// Worth knowing, not a fault (no worker seen, a large WAL).
    Note,
    Problem,
}

#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    verdict: Verdict,
    detail: String,
    /// What to do, for a note or a problem.
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            verdict: Verdict::Ok,
            detail: detail.into(),
            action: None,
        }
    }

    fn bad(
        name: &'static str,
        verdict: Verdict,
        detail: impl Into<String>,
        action: impl Into<String>,
    ) -> Self {
        Self {
            name,
            verdict,
            detail: detail.into(),
            action: Some(action.into()),
        }
    }
}

pub(crate) async fn run(cx: &Context) -> anyhow::Result<ExitCode> {
    let config = &cx.config;
    let mut checks = Vec::new();
    // File checks come first: opening the store tightens modes it finds too open.
    if let StoreUrl::Sqlite(path) = &config.store {
        let path = path.clone();
        let (integrity, wal) =
            tokio::task::spawn_blocking(move || (integrity(&path), wal(&path))).await?;
        checks.push(integrity);
        checks.push(wal);
        checks.push(durability(config.durability));
    }
    checks.push(free_space(&config.data_dir));
    checks.push(modes(config));
    checks.extend(sandbox(config));
    checks.extend(store_checks(cx).await);
    let problems = checks
        .iter()
        .filter(|c| c.verdict == Verdict::Problem)
        .count();
    crate::output::emit(
        cx.json,
        &json!({"checks": checks, "problems": problems}),
        || {
            let mut text = String::new();
            for check in &checks {
                let label = match check.verdict {
                    Verdict::Ok => "ok     ",
                    Verdict::Note => "note   ",
                    Verdict::Problem => "PROBLEM",
                };
                text.push_str(&format!("{label} {}: {}", check.name, check.detail));
                if let Some(action) = &check.action {
                    text.push_str(&format!("\n        do: {action}"));
                }
                text.push('\n');
            }
            text.push_str(&match problems {
                0 => "no problem found".to_string(),
                n => crate::output::count(n as u64, "problem", "problems"),
            });
            text
        },
    );
    Ok(if problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Whether the local servers that run in a sandbox can get one on this kernel; nothing to
/// say when none does.
fn sandbox(config: &crate::config::Config) -> Option<Check> {
    let sandboxed = crate::config::sandboxed_servers(config);
    if sandboxed.is_empty() {
        return None;
    }
    let names = sandboxed.join(", ");
    Some(match runwarden_mcp::stdio::sandbox_available() {
        Ok(()) => Check::ok(
            "sandbox",
            format!("the kernel gives local servers their namespaces ({names})"),
        ),
        Err(error) => Check::bad(
            "sandbox",
            Verdict::Problem,
            format!("local servers {names} cannot start: {error}"),
            "allow unprivileged user namespaces, or set sandbox = \"none\" for each of them",
        ),
    })
}

/// `PRAGMA quick_check` on a read-only connection.
fn integrity(path: &Path) -> Check {
    const NAME: &str = "database integrity";
    if !path.exists() {
        return Check::bad(
            NAME,
            Verdict::Problem,
            format!("no database at {}", path.display()),
            "run `runwarden init`, or restore a backup (see the README)",
        );
    }
    let answer =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|db| {
                db.busy_timeout(Duration::from_secs(5))?;
                db.query_row("PRAGMA quick_check", [], |row| row.get::<_, String>(0))
            });
    match answer {
        Ok(answer) if answer == "ok" => {
            Check::ok(NAME, format!("{} passes quick_check", path.display()))
        }
        Ok(answer) => Check::bad(
            NAME,
            Verdict::Problem,
            format!("{} is damaged: {answer}", path.display()),
            "stop every runwarden process and restore the last backup (see the README); `runwarden backup` makes one",
        ),
        Err(error) => Check::bad(
            NAME,
            Verdict::Problem,
            format!("{} cannot be checked: {error}", path.display()),
            "if it is damaged, stop every runwarden process and restore the last backup (see the README)",
        ),
    }
}

/// The WAL beside the database: its size, and a shared-memory file without it.
/// `[store] durability`: a note when the operator chose the faster mode, so nobody runs
/// it without knowing what a power cut would cost.
fn durability(durability: runwarden_store_sqlite::Durability) -> Check {
    const NAME: &str = "durability";
    match durability {
        runwarden_store_sqlite::Durability::PowerCut => Check::ok(
            NAME,
            "power_cut: audit intents and write fences are synced to disk before a request leaves",
        ),
        runwarden_store_sqlite::Durability::ProcessCrash => Check::bad(
            NAME,
            Verdict::Note,
            "process_crash: audit intents and write fences survive runwarden being killed, not a power cut or an operating-system crash, after which a write may be sent twice",
            "keep it only where a lost audit row or a repeated write after a power cut is acceptable; remove `[store] durability` for the default",
        ),
    }
}

fn wal(path: &Path) -> Check {
    const NAME: &str = "write-ahead log";
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    let (wal, shm) = (beside("-wal"), beside("-shm"));
    match std::fs::metadata(&wal) {
        Ok(meta) if meta.len() > LARGE_WAL => Check::bad(
            NAME,
            Verdict::Note,
            format!("{} is {} MiB", wal.display(), meta.len() >> 20),
            "a long-running reader keeps checkpoints from finishing: it shrinks once readers finish; restart a process stuck reading",
        ),
        Ok(meta) => Check::ok(
            NAME,
            format!("{} is {} KiB", wal.display(), meta.len() >> 10),
        ),
        Err(_) if shm.exists() => Check::bad(
            NAME,
            Verdict::Problem,
            format!(
                "{} is missing while {} exists: the log was removed under a running process",
                wal.display(),
                shm.display()
            ),
            "stop every runwarden process, check the database with `runwarden doctor` again, and restore the last backup if it is damaged",
        ),
        Err(_) => Check::ok(NAME, "no write-ahead log (nothing is open)"),
    }
}

/// Free space on the file system of the data directory.
fn free_space(dir: &Path) -> Check {
    const NAME: &str = "free space";
    match rustix::fs::statvfs(dir) {
        Ok(stats) => {
            let free = stats.f_bavail.saturating_mul(stats.f_frsize);
            let shown = format!("{} MiB free where {} is", free >> 20, dir.display());
            if free < LOW_SPACE {
                Check::bad(
                    NAME,
                    Verdict::Problem,
                    shown,
                    "free space on that file system: writes fail when it is full",
                )
            } else {
                Check::ok(NAME, shown)
            }
        }
        Err(error) => Check::bad(
            NAME,
            Verdict::Problem,
            format!("{} cannot be read: {error}", dir.display()),
            "check that the data directory exists (`runwarden init` creates it)",
        ),
    }
}

/// Files only their owner may read: the database, the master key and the anchor.
fn modes(config: &crate::config::Config) -> Check {
    use std::os::unix::fs::PermissionsExt as _;
    const NAME: &str = "file modes";
    let mut files = vec![config.audit_anchor_file.clone()];
    if !crate::config::master_key_from_env() {
        files.push(config.master_key_file.clone());
    }
    if let StoreUrl::Sqlite(path) = &config.store {
        files.push(path.clone());
    }
    let open: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let mode = std::fs::metadata(file).ok()?.permissions().mode() & 0o777;
            (mode & 0o077 != 0).then(|| format!("{} is {mode:o}", file.display()))
        })
        .collect();
    if open.is_empty() {
        Check::ok(
            NAME,
            "the database, the master key and the audit anchor are private",
        )
    } else {
        Check::bad(
            NAME,
            Verdict::Problem,
            open.join(", "),
            "chmod 600 each of them (any runwarden command that opens the store also does)",
        )
    }
}

/// The store answers (writes included), the key opens the vault and the audit chain
/// verifies against its anchor, and when a worker was last seen.
async fn store_checks(cx: &Context) -> Vec<Check> {
    let mut checks = Vec::new();
    match cx.root.backend().await {
        Ok(backend) => match backend.ready().await {
            Ok(()) => checks.push(Check::ok("store", "reachable and accepts writes")),
            Err(error) => checks.push(Check::bad(
                "store",
                Verdict::Problem,
                error.to_string(),
                "see the message; `/readyz` fails the same way until it is fixed",
            )),
        },
        Err(error) => {
            checks.push(Check::bad(
                "store",
                Verdict::Problem,
                crate::output::one_line(&error),
                "see the message: the store must open before anything else can run",
            ));
            return checks;
        }
    }
    match cx.vault().await {
        Ok(vault) => {
            checks.push(Check::ok("master key", "present and opens the vault"));
            checks.push(match vault.audit_verify().await {
                Ok(report) if report.intact && report.anchored_rows.is_some() => Check::ok("audit anchor", format!("present; the chain verifies ({} rows)", report.rows_verified)),
                Ok(report) if report.intact => Check::bad("audit anchor", Verdict::Problem, format!("{} is missing", cx.config.audit_anchor_file.display()), "restore it from the backup it was kept with, or run `runwarden audit verify --adopt-anchor` to start a new one"),
                Ok(report) => Check::bad("audit anchor", Verdict::Problem, report.problem.unwrap_or_else(|| "the audit chain does not verify".into()), "run `runwarden audit verify` for the details; restore the database and the anchor from the same backup"),
                Err(error) => Check::bad("audit anchor", Verdict::Problem, error.to_string(), "run `runwarden audit verify` for the details"),
            });
        }
        Err(error) => checks.push(Check::bad("master key", Verdict::Problem, crate::output::one_line(&error), "do what the message says; a key that does not open the vault is not the one this database was made with: point [vault] master_key_file (or RUNWARDEN_MASTER_KEY) at that one")),
    }
    checks.extend(tool_settings(cx).await);
    if let Ok(queue) = cx.root.queue().await {
        checks.push(match queue.worker_last_seen().await {
            Ok(Some(seen)) => {
                let ago = (chrono::Utc::now().timestamp_millis() - seen).max(0) / 1000;
                if ago <= crate::hints::WORKER_GONE_AFTER.as_secs() as i64 {
                    Check::ok("workers", format!("one was seen {ago} s ago"))
                } else {
                    Check::bad("workers", Verdict::Note, format!("the last one was seen {ago} s ago"), "start `runwarden worker` or `runwarden serve`; a worker that runs but cannot write to the store is not seen either (look at its log)")
                }
            }
            Ok(None) => Check::bad("workers", Verdict::Note, "none was ever seen", "start `runwarden worker` or `runwarden serve` to run queued runs"),
            Err(error) => Check::bad("workers", Verdict::Problem, error.to_string(), "see the message"),
        });
    }
    checks
}

/// Each server's `[mcp.servers.NAME.tools.TOOL]` settings against its imported catalogue:
/// a setting for a tool the server does not offer would fail every run of an agent that
/// uses the server, so it is a problem here, before a run finds it. A server never
/// imported has nothing to check against yet.
async fn tool_settings(cx: &Context) -> Vec<Check> {
    let servers: Vec<_> = cx
        .config
        .mcp_servers
        .values()
        .filter(|s| !s.tools.is_empty())
        .collect();
    if servers.is_empty() {
        return Vec::new();
    }
    let catalogue = match cx.root.catalogue().await {
        Ok(store) => store.catalogue_list(None).await,
        Err(_) => return Vec::new(), // the store check above already says why
    };
    let catalogue = match catalogue {
        Ok(entries) => entries,
        Err(error) => {
            return vec![Check::bad(
                "tool settings",
                Verdict::Problem,
                error.to_string(),
                "see the message",
            )];
        }
    };
    let mut wrong = Vec::new();
    for server in servers {
        let offered: Vec<&str> = catalogue
            .iter()
            .filter(|e| e.server == server.name)
            .map(|e| e.remote_name.as_str())
            .collect();
        if offered.is_empty() {
            continue;
        }
        if let Err(error) = server.check_tool_overrides(offered.iter().copied()) {
            wrong.push(error.to_string());
        }
    }
    if wrong.is_empty() {
        vec![Check::ok(
            "tool settings",
            "every tool setting names a tool its server offers",
        )]
    } else {
        vec![Check::bad(
            "tool settings",
            Verdict::Problem,
            wrong.join("; "),
            "fix the tool's name in the configuration (runs of agents that use the server fail until then)",
        )]
    }
}
