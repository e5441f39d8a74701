//! `runwarden audit`: list rows of the outbound-call log and verify its hash chain.

use std::process::ExitCode;

use clap::Subcommand;
use runwarden_vault::Vault;
use runwarden_vault::store::AuditFilter;
use serde_json::Value;

use super::Context;
use crate::output;
use crate::views::audit::{RowView, row_line};

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Newest rows first.
    List {
        /// Only rows with this action (http_call, http_call_refused, http_call_cancelled, ...).
        #[arg(long)]
        action: Option<String>,
        /// Only rows of this run (the correlation column).
        #[arg(long = "run", value_name = "ID")]
        run: Option<String>,
        /// At most this many rows (0: all of them).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Check every row's link, the tip anchor and the anchor file; exits 1 naming the
    /// first bad row. Also counts calls whose outcome was never recorded.
    Verify {
        /// For an installation that predates anchor files: when the anchor file is missing
        /// and the whole chain verifies, create it at the current tip. Never replaces a file.
        #[arg(long)]
        adopt_anchor: bool,
        /// Also check the log against the external witness (`[audit] witness`): the
        /// longest log it records must be in the database with the same tip.
        #[arg(long)]
        witness: bool,
    },
}

/// The largest page `GET /v1/audit` serves; `--limit 0` (all rows) through a server asks
/// for this many.
const SERVER_MAX_ROWS: u32 = 1000;

pub(crate) async fn run(cx: &Context, command: AuditCommand) -> anyhow::Result<ExitCode> {
    if let Some(server) = &cx.server {
        return through_server(cx, server, command).await;
    }
    let vault = cx.vault().await?;
    match command {
        AuditCommand::List { action, run, limit } => {
            let filter = AuditFilter {
                action,
                correlation: run,
                newest_first: true,
                limit,
                after_id: None,
            };
            let rows = vault.audit_list(filter).await?;
            let views = RowView::all(&vault, &rows).await?;
            let views: Vec<Value> = views
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
            print_rows(cx.json, &views);
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify {
            adopt_anchor,
            witness,
        } => {
            if witness && vault.external_witness_path().is_none() {
                return Err(super::Misuse(
                    "--witness checks the log against its external witness, and none is configured: set [audit] witness".into(),
                )
                .into());
            }
            let adopted = if adopt_anchor && !anchor_exists(&vault) {
                vault.audit_adopt_anchor().await?;
                true
            } else {
                false
            };
            let report = if witness {
                vault.audit_verify_witness().await?
            } else {
                vault.audit_verify().await?
            };
            let report = serde_json::to_value(report)?;
            Ok(print_verify(cx.json, &report, adopted))
        }
    }
}

/// `audit list|verify` through the server's audit API: the same rows and report, printed
/// the same way.
async fn through_server(
    cx: &Context,
    server: &crate::client::ApiClient,
    command: AuditCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::List { action, run, limit } => {
            let limit = if limit == 0 {
                SERVER_MAX_ROWS
            } else {
                limit.min(SERVER_MAX_ROWS)
            };
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &limit.to_string());
            if let Some(action) = &action {
                query.append_pair("action", action);
            }
            if let Some(run) = &run {
                query.append_pair("run", run);
            }
            let answer = server.get(&format!("/v1/audit?{}", query.finish())).await?;
            let body = server.expect(answer).await?;
            let rows = body["rows"].as_array().cloned().unwrap_or_default();
            print_rows(cx.json, &rows);
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify {
            adopt_anchor,
            witness,
        } => {
            if adopt_anchor || witness {
                return Err(super::Misuse(
                    "--adopt-anchor and --witness read the files next to the database: run them on the server's machine without --server".into(),
                )
                .into());
            }
            let answer = server.get("/v1/audit/verify").await?;
            let report = server.expect(answer).await?;
            Ok(print_verify(cx.json, &report, false))
        }
    }
}

fn print_rows(json: bool, rows: &[Value]) {
    output::emit(json, &rows, || {
        if rows.is_empty() {
            "no audit rows match".into()
        } else {
            rows.iter().map(row_line).collect::<Vec<_>>().join("\n")
        }
    });
}

/// Prints a verify report (from the vault or the API); exit 1 when the log is broken.
fn print_verify(json: bool, report: &Value, adopted: bool) -> ExitCode {
    output::emit(json, report, || {
        let rows_verified = &report["rows_verified"];
        let mut text = match (report["first_bad_row"].as_i64(), report["problem"].as_str()) {
            (Some(row), Some(problem)) => {
                format!("BROKEN at row {row}: {problem} ({rows_verified} rows verified before it)")
            }
            _ => format!(
                "intact: {}, chain and tip anchor verified{}{}",
                output::count(report["rows_verified"].as_u64().unwrap_or(0), "row", "rows"),
                match (report["anchored_rows"].as_i64(), adopted) {
                    (Some(n), true) => format!("; anchor file created at row {n}"),
                    (Some(n), false) => format!("; anchor file at row {n}"),
                    (None, _) => String::new(),
                },
                match report["witnessed_rows"].as_i64() {
                    Some(n) => format!("; external witness at row {n}"),
                    None => String::new(),
                }
            ),
        };
        match report["incomplete_calls"].as_u64().unwrap_or(0) {
            0 => {}
            n => text.push_str(&format!(
                "\n{} no recorded outcome (intent rows without a completion; see `runwarden audit list --action http_call_started`)",
                output::count(n, "call has", "calls have")
            )),
        }
        text
    });
    if report["intact"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn anchor_exists(vault: &Vault) -> bool {
    vault.anchor_path().is_some_and(|p| p.exists())
}
