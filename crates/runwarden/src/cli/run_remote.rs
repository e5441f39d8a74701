//! `runwarden run --server URL`: the run is enqueued on the server, its events are
//! followed as the server pushes them, and Ctrl-C, SIGTERM or SIGHUP cancel it
//! through the API, as they cancel a local run. The server's workers execute it; a run
//! that waits for an operator's decision is followed until it goes on and ends.

use std::process::ExitCode;
use std::time::Instant;

use runwarden_runtime::events::is_final_kind;
use runwarden_runtime::{Outcome, RunState};
use serde_json::{Value, json};

use super::Context;
use super::run::RunArgs;
use crate::client::ApiClient;
use crate::output;

/// Exit statuses, as `run` on the store gives them.
const EXIT_CANCELLED: u8 = 130;
const EXIT_AWAITING: u8 = 3;

/// Resolves on the first Ctrl-C, SIGTERM or SIGHUP; the handlers are installed when this
/// is called, so a signal that comes before the future is polled is not lost.
fn stop_asked() -> impl std::future::Future<Output = &'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt()).ok();
        let mut term = signal(SignalKind::terminate()).ok();
        let mut hup = signal(SignalKind::hangup()).ok();
        async move {
            tokio::select! {
                () = received(int.as_mut()) => "Ctrl-C",
                () = received(term.as_mut()) => "SIGTERM",
                () = received(hup.as_mut()) => "SIGHUP",
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

/// The next delivery of a signal whose handler could be installed; never otherwise.
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => drop(signal.recv().await),
        None => std::future::pending::<()>().await,
    }
}

/// What `run` reports as its outcome for a run in `status`: the word `run` says when it
/// executes the run itself.
fn outcome_of(status: Option<RunState>) -> Outcome {
    match status {
        Some(RunState::Completed) => Outcome::Completed,
        Some(RunState::Cancelled) => Outcome::Cancelled,
        Some(RunState::WaitingForApproval) => Outcome::WaitingForApproval,
        _ => Outcome::Failed,
    }
}

pub(crate) async fn run(
    cx: &Context,
    server: &ApiClient,
    args: RunArgs,
) -> anyhow::Result<ExitCode> {
    let stop = stop_asked(); // before any work: an early Ctrl-C still cancels
    tokio::pin!(stop);
    let created = server
        .enqueue(
            &args.agent,
            &args.prompt,
            &args.budgets.asked(),
            &args.tags.checked()?,
            None,
        )
        .await?;
    let Some(run_id) = created["run_id"].as_str().map(str::to_string) else {
        anyhow::bail!("the server created a run but did not say its id");
    };
    if !cx.json {
        eprintln!("run {run_id} queued on the server (Ctrl-C cancels it)");
    }
    let mut after = 0;
    let mut cancelled_at: Option<Instant> = None;
    let status = loop {
        let mut saw_final = false;
        let json = cx.json;
        let followed = {
            let follow = server.follow(&run_id, after, |event| {
                saw_final |= event["kind"].as_str().is_some_and(is_final_kind);
                let event = crate::views::event_from_json(event);
                if json {
                    output::line(crate::views::event_json(&event));
                } else {
                    output::line(crate::views::event_line(&event));
                }
            });
            tokio::pin!(follow);
            loop {
                tokio::select! {
                    followed = &mut follow => break followed,
                    by = &mut stop, if cancelled_at.is_none() => {
                        cancelled_at = Some(Instant::now());
                        tracing::info!(run = %run_id, actor = by, "cancelling the run through the server");
                        cancel(server, &run_id).await;
                    }
                }
            }
        };
        after = followed?;
        let report = run_view(server, &run_id).await?;
        let status = report["status"].as_str().and_then(RunState::parse);
        // The server ends a stream after the final event, after a finished run's grace, or
        // when it drains: only the last needs a new stream, which resumes after `after`.
        // A run waiting for an operator is followed on: it goes on once they answer.
        if saw_final || status.is_none_or(RunState::is_terminal) {
            break report;
        }
    };
    let outcome = outcome_of(status["status"].as_str().and_then(RunState::parse));
    let summary = json!({
        "run_id": run_id, "outcome": outcome.as_str(), "status": status["status"],
        "termination_reason": status["termination_reason"], "pending_effect": status["pending_effect"],
        "usage": status["usage"],
    });
    output::emit(cx.json, &summary, || {
        let mut text = format!("run {run_id} {}", outcome.as_str());
        if let Some(reason) = status["termination_reason"].as_str() {
            text.push_str(&format!(": {reason}"));
        }
        text.push_str(&format!(
            " ({} input, {} output tokens)",
            status["usage"]["input_tokens"], status["usage"]["output_tokens"]
        ));
        if outcome == Outcome::WaitingForApproval {
            text.push_str(&format!(
                "\nwaiting for an operator: `runwarden decisions list --run {run_id}`, then approve, deny or resolve; a worker resumes the run"
            ));
        }
        if let (Some(at), Outcome::Cancelled) = (cancelled_at, outcome) {
            text.push_str(&format!(
                " ({} ms after the cancel)",
                at.elapsed().as_millis()
            ));
            if let Some(effect) = status["pending_effect"].as_str() {
                text.push_str(&format!("\na {effect} was in flight: its effect on the server is unknown and it will not be retried"));
            }
        }
        text
    });
    Ok(match outcome {
        Outcome::Completed => ExitCode::SUCCESS,
        Outcome::Cancelled => ExitCode::from(EXIT_CANCELLED),
        Outcome::WaitingForApproval => ExitCode::from(EXIT_AWAITING),
        _ => ExitCode::FAILURE,
    })
}

async fn run_view(server: &ApiClient, run_id: &str) -> anyhow::Result<Value> {
    let answer = server.get(&format!("/v1/runs/{run_id}")).await?;
    server.expect(answer).await
}

/// `POST /v1/runs/{id}/cancel`; a refusal (the run had just ended) is said, not fatal:
/// the follow then shows how it ended.
async fn cancel(server: &ApiClient, run_id: &str) {
    let outcome = match server
        .post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
        .await
    {
        Ok(answer) => server.expect(answer).await.map(drop),
        Err(error) => Err(error),
    };
    if let Err(error) = outcome {
        eprintln!(
            "error: could not cancel run {run_id}: {}",
            output::one_line(&error)
        );
    }
}
