//! `runwarden audit`: list rows of the outbound-call log and verify its hash chain.

use std::process::ExitCode;

use clap::Subcommand;
use runwarden_vault::audit::action;
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{AuditRow, Vault};
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
    /// Check every row's link, the tip anchor and the anchor file; exits 1 naming the
    /// first bad row. Also counts calls whose outcome was never recorded.
    Verify {
        /// For an installation that predates anchor files: when the anchor file is missing
        /// and the whole chain verifies, create it at the current tip. Never replaces a file.
        #[arg(long)]
        adopt_anchor: bool,
    },
}

/// What `audit list` says about an intent row no completion row names (V7 amended).
pub(crate) const NO_OUTCOME: &str = "no outcome recorded: the process stopped or is still waiting";

/// One audit row as printed: the event's columns plus id and hash.
#[derive(Serialize)]
pub(crate) struct RowView<'a> {
    id: i64,
    time: String,
    #[serde(flatten)]
    event: &'a runwarden_vault::AuditEvent,
    hash: String,
    /// For an intent row only: true when no completion row names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    incomplete: Option<bool>,
    /// For an incomplete intent row: [`NO_OUTCOME`].
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'static str>,
}

impl<'a> RowView<'a> {
    pub(crate) fn new(row: &'a AuditRow) -> Self {
        Self {
            id: row.id,
            time: output::time(row.event.time_ms),
            event: &row.event,
            hash: hex::encode(row.hash),
            incomplete: None,
            outcome: None,
        }
    }

    /// Views of `rows`, with every intent row marked complete or not.
    pub(crate) async fn all(vault: &Vault, rows: &'a [AuditRow]) -> anyhow::Result<Vec<Self>> {
        let intents: Vec<i64> = rows
            .iter()
            .filter(|r| r.event.action == action::HTTP_CALL_STARTED)
            .map(|r| r.id)
            .collect();
        let incomplete = vault.audit_incomplete(intents).await?;
        Ok(rows
            .iter()
            .map(|row| {
                let mut view = Self::new(row);
                if row.event.action == action::HTTP_CALL_STARTED {
                    let open = incomplete.binary_search(&row.id).is_ok();
                    view.incomplete = Some(open);
                    view.outcome = open.then_some(NO_OUTCOME);
                }
                view
            })
            .collect())
    }

    /// One line for people.
    pub(crate) fn line(&self) -> String {
        let e = self.event;
        let mut text = format!(
            "#{} {} {} {} {} {}{} status={} {}ms",
            self.id,
            self.time,
            e.action,
            if e.action == action::HTTP_CALL_STARTED {
                "intent"
            } else if e.success {
                "ok"
            } else {
                "FAILED"
            },
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
        if let Some(intent) = e.intent_id {
            text.push_str(&format!(" intent=#{intent}"));
        }
        if let Some(error) = &e.error {
            text.push_str(&format!(" error=\"{error}\""));
        }
        if let Some(outcome) = self.outcome {
            text.push_str(&format!(" INCOMPLETE: {outcome}"));
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
            let views = RowView::all(&vault, &rows).await?;
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
        AuditCommand::Verify { adopt_anchor } => {
            let adopted = if adopt_anchor && !anchor_exists(&vault) {
                vault.audit_adopt_anchor().await?;
                true
            } else {
                false
            };
            let report = vault.audit_verify().await?;
            output::emit(cx.json, &report, || {
                let mut text = match (&report.first_bad_row, &report.problem) {
                    (Some(row), Some(problem)) => format!(
                        "BROKEN at row {row}: {problem} ({} rows verified before it)",
                        report.rows_verified
                    ),
                    _ => format!(
                        "intact: {} rows, chain and tip anchor verified{}",
                        report.rows_verified,
                        match (report.anchored_rows, adopted) {
                            (Some(n), true) => format!("; anchor file created at row {n}"),
                            (Some(n), false) => format!("; anchor file at row {n}"),
                            (None, _) => String::new(),
                        }
                    ),
                };
                if report.incomplete_calls > 0 {
                    text.push_str(&format!(
                        "\n{} calls have no recorded outcome (intent rows without a completion; see `runwarden audit list --action http_call_started`)",
                        report.incomplete_calls
                    ));
                }
                text
            });
            Ok(if report.intact {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn anchor_exists(vault: &Vault) -> bool {
    vault.anchor_path().is_some_and(|p| p.exists())
}
