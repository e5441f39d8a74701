//! `runwarden runs list`: the runs, newest first, from the store or through a server
//! (`GET /v1/runs`), printed the same either way.

use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};
use runwarden_runtime::RunState;
use runwarden_runtime::store::RunFilter;
use serde_json::Value;

use super::Context;
use crate::output;

/// The most runs one `runs list` prints, the API's largest page.
const MAX_LIMIT: u32 = 200;

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// Runs, newest first: id, status, agent, rounds, last change and why it ended.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only runs in this status: queued, running, waiting_for_approval, completed, failed
    /// or cancelled.
    #[arg(long)]
    status: Option<String>,
    /// Only runs of this agent.
    #[arg(long)]
    agent: Option<String>,
    /// At most this many runs (1 to 200).
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

pub(crate) async fn run(cx: &Context, command: RunsCommand) -> anyhow::Result<ExitCode> {
    let RunsCommand::List(args) = command;
    list(cx, args).await
}

async fn list(cx: &Context, args: ListArgs) -> anyhow::Result<ExitCode> {
    if !(1..=MAX_LIMIT).contains(&args.limit) {
        bail!("--limit must be between 1 and {MAX_LIMIT}");
    }
    let status = match args.status.as_deref() {
        None => None,
        Some(text) => match RunState::parse(text) {
            Some(status) => Some(status),
            None => bail!(
                "unknown status {text:?}: use queued, running, waiting_for_approval, completed, failed or cancelled"
            ),
        },
    };
    let runs: Vec<Value> = match &cx.server {
        Some(server) => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &args.limit.to_string());
            if let Some(status) = status {
                query.append_pair("status", status.as_str());
            }
            if let Some(agent) = &args.agent {
                query.append_pair("agent", agent);
            }
            let answer = server.get(&format!("/v1/runs?{}", query.finish())).await?;
            let body = server.expect(answer).await?;
            body["runs"].as_array().cloned().unwrap_or_default()
        }
        None => {
            let runs = cx.root.runs().await?;
            let found = runs
                .run_list(RunFilter {
                    status,
                    agent: args.agent.clone(),
                    before_id: None,
                    limit: args.limit,
                })
                .await?;
            found.iter().map(crate::views::run_json).collect()
        }
    };
    output::emit(cx.json, &runs, || table(&runs));
    Ok(ExitCode::SUCCESS)
}

/// One line per run under a header; the reason last, in full (it is what an operator
/// looks for).
fn table(runs: &[Value]) -> String {
    if runs.is_empty() {
        return "no runs match".into();
    }
    let field = |run: &Value, name: &str| run[name].as_str().unwrap_or("-").to_string();
    let agent_width = runs
        .iter()
        .map(|run| field(run, "agent").chars().count())
        .max()
        .unwrap_or(0)
        .max("AGENT".len());
    let mut lines = vec![format!(
        "{:<36}  {:<20}  {:<agent_width$}  {:>6}  {:<24}  REASON",
        "RUN", "STATUS", "AGENT", "ROUNDS", "UPDATED"
    )];
    for run in runs {
        lines.push(
            format!(
                "{:<36}  {:<20}  {:<agent_width$}  {:>6}  {:<24}  {}",
                field(run, "run_id"),
                field(run, "status"),
                field(run, "agent"),
                run["rounds"],
                field(run, "updated"),
                run["termination_reason"].as_str().unwrap_or_default()
            )
            .trim_end()
            .to_string(),
        );
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_has_a_header_one_line_per_run_and_the_reason_in_full() {
        let reason = "MODEL_FAILED: ".to_string() + &"x".repeat(300);
        let runs = [
            json!({"run_id": "r-1", "status": "failed", "agent": "helper", "rounds": 2, "updated": "2026-12-03T12:00:00.000Z", "termination_reason": reason}),
            json!({"run_id": "r-2", "status": "queued", "agent": "a", "rounds": 0, "updated": "2026-12-03T12:00:01.000Z", "termination_reason": null}),
        ];
        let text = table(&runs);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("RUN") && lines[0].ends_with("REASON"));
        assert!(
            lines[1].ends_with(&reason),
            "the reason is never cut: {text}"
        );
        assert!(lines[2].contains("queued") && !lines[2].ends_with(' '));
        assert_eq!(table(&[]), "no runs match");
    }
}
