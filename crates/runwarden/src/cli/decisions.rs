//! `runwarden decisions list`, `approve`, `deny`, `resolve`, `answer`: the operator's
//! answers to a run's pending decisions, on the store or through `--server`. An answer on
//! the store is audited with the actor `cli`; through the server, with the token's name.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use runwarden_runtime::{Answer, AnswerRequest, DecisionFilter, DecisionStatus};
use serde_json::{Value, json};

use super::Context;
use crate::decisions::{decision_json, decision_text};
use crate::output;

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only this run's decisions.
    #[arg(long, value_name = "RUN_ID")]
    run: Option<String>,
    /// Only decisions in this status: pending (the default without --run), answered,
    /// expired, dropped, or all.
    #[arg(long)]
    status: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ApproveArgs {
    /// The decision's id.
    decision_id: String,
    /// Make the call with these arguments instead (a JSON object that fits the tool's
    /// schema); both are recorded.
    #[arg(long, value_name = "JSON")]
    arguments: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DenyArgs {
    /// The decision's id.
    decision_id: String,
    /// Why; the model reads "denied by an operator: REASON".
    #[arg(long)]
    reason: String,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["applied", "not_applied", "cancel"])))]
pub(crate) struct ResolveArgs {
    /// The decision's id.
    decision_id: String,
    /// The uncertain write took effect (its result is unknown).
    #[arg(long)]
    applied: bool,
    /// It did not take effect; the model may decide again.
    #[arg(long)]
    not_applied: bool,
    /// Cancel the run instead.
    #[arg(long)]
    cancel: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["content", "decline", "cancel"])))]
pub(crate) struct AnswerArgs {
    /// The decision's id.
    decision_id: String,
    /// The answer to the server's question: a JSON object that fits its requested schema.
    #[arg(long, value_name = "JSON")]
    content: Option<String>,
    /// Decline the server's question.
    #[arg(long)]
    decline: bool,
    /// Dismiss it without choosing (the elicitation's cancel).
    #[arg(long)]
    cancel: bool,
}

fn json_object(text: &str, what: &str) -> anyhow::Result<Value> {
    let value: Value =
        serde_json::from_str(text).with_context(|| format!("{what} is not valid JSON"))?;
    if !value.is_object() {
        bail!("{what} must be a JSON object");
    }
    Ok(value)
}

pub(crate) async fn list(cx: &Context, args: ListArgs) -> anyhow::Result<ExitCode> {
    let status = match args.status.as_deref() {
        Some("all") => None,
        Some(text) => Some(text.to_string()),
        None if args.run.is_none() => Some("pending".to_string()),
        None => None,
    };
    let views: Vec<Value> = match &cx.server {
        Some(server) => {
            let mut query = vec![format!("limit=200")];
            if let Some(status) = &status {
                query.push(format!("status={status}"));
            }
            if let Some(run) = &args.run {
                query.push(format!("run={run}"));
            }
            let answer = server
                .get(&format!("/v1/decisions?{}", query.join("&")))
                .await?;
            let body = server.expect(answer).await?;
            body["decisions"].as_array().cloned().unwrap_or_default()
        }
        None => {
            let status = status
                .map(|text| {
                    DecisionStatus::parse(&text).with_context(|| {
                        format!("unknown status {text:?}: use pending, answered, expired, dropped or all")
                    })
                })
                .transpose()?;
            let store = cx.store().await?;
            store
                .decision_list(DecisionFilter {
                    status,
                    run_id: args.run.clone(),
                    due_by_ms: None,
                    limit: 200,
                })
                .await?
                .iter()
                .map(decision_json)
                .collect()
        }
    };
    if cx.json {
        output::line(json!({ "decisions": views }));
    } else if views.is_empty() {
        output::line("no decisions");
    } else {
        for view in &views {
            output::line(decision_text(view));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Answers one decision, through the server or on the store, and prints what it did.
async fn reply(cx: &Context, id: &str, request: AnswerRequest) -> anyhow::Result<ExitCode> {
    let view = match &cx.server {
        Some(server) => {
            let body = json!({
                "answer": request.answer.map(Answer::as_str),
                "reason": request.reason,
                "arguments": request.arguments,
                "content": request.content,
            });
            let answer = server.post(&format!("/v1/decisions/{id}"), body).await?;
            server.expect(answer).await?
        }
        None => {
            let store = cx.store().await?;
            let catalogue = cx.root.catalogue().await?;
            let vault = cx.vault().await?;
            let answered =
                crate::decisions::answer(&*store, &*catalogue, &vault, id, request, "cli").await?;
            if !answered.audited {
                eprintln!(
                    "warning: the answer stands but its audit row could not be written; see the log"
                );
            }
            decision_json(&answered.decision)
        }
    };
    output::emit(cx.json, &view, || {
        format!(
            "decision {} answered {}; run {} {}",
            view["decision_id"].as_str().unwrap_or(id),
            view["answer"].as_str().unwrap_or("?"),
            view["run_id"].as_str().unwrap_or("?"),
            match view["answer"].as_str() {
                Some("cancel") if view["kind"] != "input" => "is cancelled",
                _ if view["kind"] == "input" || view["waits_in_call"] == true => {
                    "goes on with its call"
                }
                _ => "is queued for a worker",
            }
        )
    });
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn approve(cx: &Context, args: ApproveArgs) -> anyhow::Result<ExitCode> {
    let arguments = args
        .arguments
        .as_deref()
        .map(|a| json_object(a, "--arguments"))
        .transpose()?;
    let request = AnswerRequest {
        answer: Some(Answer::Approve),
        arguments,
        ..AnswerRequest::default()
    };
    reply(cx, &args.decision_id, request).await
}

pub(crate) async fn deny(cx: &Context, args: DenyArgs) -> anyhow::Result<ExitCode> {
    let request = AnswerRequest {
        answer: Some(Answer::Deny),
        reason: Some(args.reason),
        ..AnswerRequest::default()
    };
    reply(cx, &args.decision_id, request).await
}

pub(crate) async fn resolve(cx: &Context, args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let answer = if args.applied {
        Answer::Applied
    } else if args.not_applied {
        Answer::NotApplied
    } else {
        Answer::Cancel
    };
    let request = AnswerRequest {
        answer: Some(answer),
        ..AnswerRequest::default()
    };
    reply(cx, &args.decision_id, request).await
}

pub(crate) async fn answer(cx: &Context, args: AnswerArgs) -> anyhow::Result<ExitCode> {
    let request = match (&args.content, args.decline) {
        (Some(content), _) => AnswerRequest {
            answer: Some(Answer::Accept),
            content: Some(json_object(content, "--content")?),
            ..AnswerRequest::default()
        },
        (None, true) => AnswerRequest {
            answer: Some(Answer::Decline),
            ..AnswerRequest::default()
        },
        (None, false) => AnswerRequest {
            answer: Some(Answer::Cancel),
            ..AnswerRequest::default()
        },
    };
    reply(cx, &args.decision_id, request).await
}

/// `status` of a waiting run: its pending decision, from the server or the store.
pub(crate) async fn pending_of(cx: &Context, run_id: &str) -> anyhow::Result<Option<Value>> {
    Ok(match &cx.server {
        Some(server) => {
            let answer = server
                .get(&format!("/v1/decisions?run={run_id}&status=pending"))
                .await?;
            let body = server.expect(answer).await?;
            body["decisions"]
                .as_array()
                .and_then(|d| d.first().cloned())
        }
        None => {
            let store = cx.store().await?;
            store
                .decision_list(DecisionFilter {
                    status: Some(DecisionStatus::Pending),
                    run_id: Some(run_id.to_string()),
                    due_by_ms: None,
                    limit: 1,
                })
                .await?
                .first()
                .map(decision_json)
        }
    })
}
