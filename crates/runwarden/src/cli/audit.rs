//! `runwarden audit`: list rows of the outbound-call log and verify its hash chain.

use std::process::ExitCode;

use clap::Subcommand;
use runwarden_vault::AuditRow;
use runwarden_vault::store::AuditFilter;
use serde::Serialize;

use super::Context;
use crate::output;

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
    /// Check every row's link and the tip anchor; exits 1 naming the first bad row.
    Verify,
}

/// One audit row as printed: the event's columns plus id and hash.
#[derive(Serialize)]
pub(crate) struct RowView<'a> {
    id: i64,
    time: String,
    #[serde(flatten)]
    event: &'a runwarden_vault::AuditEvent,
    hash: String,
}

impl<'a> RowView<'a> {
    pub(crate) fn new(row: &'a AuditRow) -> Self {
        Self {
            id: row.id,
            time: output::time(row.event.time_ms),
            event: &row.event,
            hash: hex::encode(row.hash),
        }
    }

    /// One line for people.
    pub(crate) fn line(&self) -> String {
        let e = self.event;
        let mut text = format!(
            "#{} {} {} {} {} {}{} status={} {}ms",
            self.id,
            self.time,
            e.action,
            if e.success { "ok" } else { "FAILED" },
            e.method,
            e.host,
            e.path,
            e.status,
            e.duration_ms
        );
        if let Some(secret) = &e.secret {
            text.push_str(&format!(" secret={secret}"));
        }
        if let Some(run) = &e.correlation {
            text.push_str(&format!(" run={run}"));
        }
        if let Some(error) = &e.error {
            text.push_str(&format!(" error=\"{error}\""));
        }
        text
    }
}

pub(crate) async fn run(cx: &Context, command: AuditCommand) -> anyhow::Result<ExitCode> {
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
            let views: Vec<RowView<'_>> = rows.iter().map(RowView::new).collect();
            output::emit(cx.json, &views, || {
                if views.is_empty() {
                    "no audit rows match".into()
                } else {
                    views
                        .iter()
                        .map(RowView::line)
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            });
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify => {
            let report = vault.audit_verify().await?;
            output::emit(cx.json, &report, || {
                match (&report.first_bad_row, &report.problem) {
                    (Some(row), Some(problem)) => format!(
                        "BROKEN at row {row}: {problem} ({} rows verified before it)",
                        report.rows_verified
                    ),
                    _ => format!(
                        "intact: {} rows, chain and tip anchor verified",
                        report.rows_verified
                    ),
                }
            });
            Ok(if report.intact {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
