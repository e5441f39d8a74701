//! `runwarden run`, `cancel`, `status`, `events`: synchronous runs and what operators ask
//! of any run.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use runwarden_models::Usage;
use runwarden_runtime::events::is_final_kind;
use runwarden_runtime::{
    Budgets, Canceller, Executor, Outcome, Run, RunEvent, RunState, cancel_run, usage_of,
};
use serde_json::{Value, json};

use super::Context;
use super::signals::Interrupt;
use crate::config::AgentConfig;
use crate::live::{News, news_of};
use crate::output;
use crate::views::{event_from_json, event_json, event_line};

/// Exit status of a cancelled run (128 + SIGINT).
const EXIT_CANCELLED: u8 = 130;

/// The cause [`super::signals::Interrupt`] reports when the reader of stdout went away.
pub(crate) const CLOSED_STDOUT: &str = "a closed standard output";

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The agent, from [agents.NAME].
    #[arg(long)]
    pub(crate) agent: String,
    /// What to ask the agent.
    pub(crate) prompt: String,
    #[command(flatten)]
    pub(crate) budgets: BudgetArgs,
    #[command(flatten)]
    pub(crate) tags: TagArgs,
}

/// The tags a run is started with: what a policy may read of the run.
#[derive(Debug, Args)]
pub(crate) struct TagArgs {
    /// A tag for the run (letters, digits and _ - . : / =); repeat for more.
    #[arg(long = "tag", value_name = "TAG")]
    pub(crate) tags: Vec<String>,
}

impl TagArgs {
    /// The tags, checked before anything is stored or sent.
    pub(crate) fn checked(&self) -> anyhow::Result<Vec<String>> {
        runwarden_runtime::rules::check_tags(&self.tags).map_err(anyhow::Error::msg)?;
        Ok(self.tags.clone())
    }
}

/// A run's own budgets; each may only lower its agent's.
#[derive(Debug, Args)]
pub(crate) struct BudgetArgs {
    /// Output tokens the run may generate, summed over its model calls.
    #[arg(long)]
    max_output_tokens: Option<u64>,
    /// Seconds the run may take, from its creation.
    #[arg(long)]
    max_wall_seconds: Option<u64>,
    /// Tool calls the run may make.
    #[arg(long)]
    max_tool_calls: Option<u32>,
}

impl BudgetArgs {
    /// The budgets asked for, unchecked (a server checks them against its configuration).
    pub(crate) fn asked(&self) -> Budgets {
        Budgets {
            max_output_tokens_total: self.max_output_tokens,
            max_wall_seconds: self.max_wall_seconds,
            max_tool_calls: self.max_tool_calls,
        }
    }

    /// The budgets asked for, checked against the agent's (only lower).
    pub(crate) fn checked(&self, agent: &AgentConfig) -> anyhow::Result<Budgets> {
        let budgets = self.asked();
        agent
            .budgets
            .check_request(&budgets)
            .with_context(|| format!("agent {}: leave the flag out or lower it", agent.name))?;
        Ok(budgets)
    }
}

#[derive(Debug, Args)]
pub(crate) struct RunIdArgs {
    /// The run's id.
    run_id: String,
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    /// The run's id.
    run_id: String,
    /// Cancel only this call of a gateway session (its id, as `GET /v1/runs/RUN/calls`
    /// lists it); the session goes on. Needs --server: only the server holding the
    /// session knows its calls.
    #[arg(long, value_name = "CALL_ID")]
    call: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct EventsArgs {
    /// The run's id.
    run_id: String,
    /// Keep printing events as they come until the run has ended.
    #[arg(long)]
    follow: bool,
}

fn print_event(json: bool, event: &RunEvent) {
    if json {
        output::line(event_json(event));
    } else {
        output::line(event_line(event));
    }
}

pub(crate) async fn run(cx: &Context, args: RunArgs) -> anyhow::Result<ExitCode> {
    // Installed before any work, so an early Ctrl-C still cancels through the operator path.
    // Ctrl-C, SIGTERM, SIGHUP and a closed standard output all cancel the run (the
    // process must not die with the run left to a later worker).
    let interrupted = Arc::new(super::signals::Interrupt::default());
    super::signals::cancel_on_signals(interrupted.clone());
    super::signals::cancel_on_closed_stdout(interrupted.clone());
    let executor = cx.root.executor("run", false, None).await?;
    // O6, R12: what other processes write on a shared SQLite file (an operator's answer to
    // this run's question, a cancel) reaches this process's feed within 250 ms.
    cx.root.watch_other_writers().await?;
    let agents = cx.root.agents("run").await?;
    let budgets = args.budgets.checked(cx.config.agent(&args.agent)?)?;
    // Started on this machine's command line: no token started it.
    let origin = runwarden_runtime::RunOrigin {
        started_by: None,
        tags: args.tags.checked()?,
    };
    let agent = agents.build(&args.agent).await?;
    let run = executor
        .create_sync_with(&agent.name, &args.prompt, &budgets, origin)
        .await
        .context("while creating the run")?;
    if !cx.json {
        eprintln!("run {} (Ctrl-C cancels it)", run.id);
    }
    let cancelled_at = cancel_on_interrupt(executor.clone(), run.id.clone(), interrupted.clone());
    let stdout_gone = Arc::new(AtomicBool::new(false));
    let observer = printer(cx.json, stdout_gone.clone(), interrupted.clone());
    let outcome = executor
        .execute(&run, &agent, &args.prompt, Some(observer))
        .await;
    let final_row = executor
        .store()
        .run_get(&run.id)
        .await?
        .context("the run vanished")?;
    // L5: the run's usage, summed from its stored model steps.
    let usage = match executor.store().run_events(&run.id, 0, 0).await {
        Ok(events) => usage_of(&events),
        Err(error) => {
            tracing::warn!(run = %run.id, %error, "could not read the run's events to sum its usage");
            Usage::default()
        }
    };
    let summary = json!({
        "run_id": run.id, "outcome": outcome.as_str(), "status": final_row.status.as_str(),
        "termination_reason": final_row.termination_reason, "pending_effect": final_row.pending_effect,
        "usage": { "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens },
    });
    let stdout_closed =
        stdout_gone.load(Ordering::SeqCst) || interrupted.cause() == Some(CLOSED_STDOUT);
    let human = || {
        let since = cancelled_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed().as_millis());
        let after = since.zip(interrupted.cause());
        summary_text(&run.id, outcome, &final_row, &usage, after)
    };
    if stdout_closed {
        // The reader is gone: the summary still reaches the user, on stderr.
        eprintln!(
            "{}",
            if cx.json {
                summary.to_string()
            } else {
                human()
            }
        );
    } else {
        output::emit(cx.json, &summary, human);
    }
    Ok(match outcome {
        Outcome::Completed => ExitCode::SUCCESS,
        Outcome::Cancelled => ExitCode::from(EXIT_CANCELLED),
        // R12: not a failure; the run waits for an operator's decision.
        Outcome::WaitingForApproval => ExitCode::from(EXIT_AWAITING),
        _ => ExitCode::FAILURE,
    })
}

/// Cancels the run through the operator's path when `interrupted` fires (Ctrl-C, SIGTERM,
/// SIGHUP, a closed standard output): the guarded row update, then the in-process wake-up
/// of its calls in flight. Returns when the cancel was issued, once it is.
fn cancel_on_interrupt(
    executor: Arc<Executor>,
    run_id: String,
    interrupted: Arc<Interrupt>,
) -> Arc<Mutex<Option<Instant>>> {
    let cancelled_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stamp = cancelled_at.clone();
    tokio::spawn(async move {
        let cause = interrupted.fired().await; // a cause before the run existed is kept as a permit
        *stamp.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let actor = format!("cli ({cause})");
        tracing::info!(run = %run_id, actor, "cancelling the run");
        if let Err(error) = executor.cancel(&run_id).await {
            eprintln!("error: could not cancel run {run_id}: {error}");
        }
    });
    cancelled_at
}

/// Prints each step as it is stored. A step that cannot be printed because the reader
/// went away (`| head -1`) sets `gone` and cancels the run; nothing more is printed to
/// the closed pipe.
fn printer(
    json: bool,
    gone: Arc<AtomicBool>,
    interrupted: Arc<Interrupt>,
) -> runwarden_runtime::Observer {
    Arc::new(move |event: &RunEvent| {
        if gone.load(Ordering::SeqCst) {
            return;
        }
        let text = if json {
            event_json(event).to_string()
        } else {
            event_line(event)
        };
        if let Err(error) = output::try_line(&text) {
            gone.store(true, Ordering::SeqCst);
            interrupted.fire(CLOSED_STDOUT);
            if error.kind() != std::io::ErrorKind::BrokenPipe {
                eprintln!("error: could not write to standard output: {error}");
            }
        }
    })
}

/// A finished `run` for people: its outcome and why, its usage, and what to do next when
/// it waits for an operator or was cancelled (`after`: how long after which cause).
fn summary_text(
    run_id: &str,
    outcome: Outcome,
    final_row: &Run,
    usage: &Usage,
    after: Option<(u128, &str)>,
) -> String {
    let mut text = format!("run {run_id} {}", outcome.as_str());
    if let Some(reason) = &final_row.termination_reason {
        text.push_str(&format!(": {reason}"));
    }
    text.push_str(&format!(
        " ({} input, {} output tokens)",
        usage.input_tokens, usage.output_tokens
    ));
    if outcome == Outcome::WaitingForApproval {
        // R12: the run is parked; a worker resumes it once an operator answers.
        text.push_str(&format!(
            "\nwaiting for an operator: `runwarden decisions list --run {run_id}`, then approve, deny or resolve; a worker resumes the run"
        ));
    }
    if outcome == Outcome::Cancelled {
        if let Some((ms, cause)) = after {
            text.push_str(&format!(" ({ms} ms after {cause})"));
        }
        if let Some(effect) = &final_row.pending_effect {
            text.push_str(&format!("\na {effect} was in flight: its effect on the server is unknown and it will not be retried"));
        }
    }
    text
}

/// `run`'s exit code when the run parked on an operator decision.
const EXIT_AWAITING: u8 = 3;

pub(crate) async fn cancel(cx: &Context, args: CancelArgs) -> anyhow::Result<ExitCode> {
    if let Some(call) = &args.call {
        return cancel_call(cx, &args.run_id, call).await;
    }
    // Through a server, the cancel also wakes the run's in-flight calls at once if the
    // server executes it; on the store alone, they see it within about a second.
    let previous = match &cx.server {
        Some(server) => {
            let answer = server
                .post(&format!("/v1/runs/{}/cancel", args.run_id), json!({}))
                .await?;
            let body = server.expect(answer).await?;
            body["previous"].as_str().unwrap_or("unknown").to_string()
        }
        None => {
            let store = cx.store().await?;
            let previous = cancel_run(Canceller::Store(store.as_ref()), &args.run_id).await?;
            tracing::info!(run = %args.run_id, actor = "cli", previous = previous.as_str(), "run cancelled");
            previous.as_str().to_string()
        }
    };
    let report = json!({ "run_id": args.run_id, "cancelled": true, "previous": previous });
    output::emit(cx.json, &report, || {
        format!("cancelled run {} (it was {previous})", args.run_id)
    });
    Ok(ExitCode::SUCCESS)
}

/// One call of a gateway session, through the server that holds the session.
async fn cancel_call(cx: &Context, run_id: &str, call: &str) -> anyhow::Result<ExitCode> {
    let Some(server) = &cx.server else {
        anyhow::bail!(
            "cancelling one call needs the server that holds its session: add --server URL"
        );
    };
    let path = format!("/v1/runs/{run_id}/calls/{call}/cancel");
    let answer = server.post(&path, json!({})).await?;
    let report = server.expect(answer).await?;
    output::emit(cx.json, &report, || {
        format!("cancelled call {call} of run {run_id}; its session goes on")
    });
    Ok(ExitCode::SUCCESS)
}

/// The run JSON (`views::run_json`), from the server or the store.
async fn run_report(cx: &Context, run_id: &str) -> anyhow::Result<Value> {
    match &cx.server {
        Some(server) => {
            let answer = server.get(&format!("/v1/runs/{run_id}")).await?;
            server.expect(answer).await
        }
        None => {
            let store = cx.store().await?;
            let Some(run) = store.run_get(run_id).await? else {
                bail!("no run with id {run_id}");
            };
            let events = store.run_events(run_id, 0, 0).await?;
            Ok(crate::views::run_json_with_usage(&run, &events))
        }
    }
}

/// A run for people, from its JSON (so the server and the store print the same).
fn status_text(report: &Value) -> String {
    let field = |name: &str| report[name].as_str().unwrap_or_default().to_string();
    let mut text = format!(
        "run {}\n  agent {}\n  status {}",
        field("run_id"),
        field("agent"),
        field("status")
    );
    if let Some(reason) = report["termination_reason"].as_str() {
        text.push_str(&format!(" ({reason})"));
    }
    if let Some(who) = report["started_by"].as_str() {
        text.push_str(&format!("\n  started by {who}"));
    }
    let tags: Vec<&str> = report["tags"]
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !tags.is_empty() {
        text.push_str(&format!("\n  tags {}", tags.join(", ")));
    }
    text.push_str(&format!(
        "\n  rounds {}, attempts {}",
        report["rounds"], report["attempts"]
    ));
    if let Some(usage) = report.get("usage") {
        text.push_str(&format!(
            "\n  tokens {} input, {} output",
            usage["input_tokens"], usage["output_tokens"]
        ));
    }
    let finished = report["status"]
        .as_str()
        .and_then(RunState::parse)
        .is_some_and(RunState::is_terminal);
    match report["lease_holder"].as_str() {
        Some(holder) if finished => text.push_str(&format!("\n  last lease holder {holder}")),
        Some(holder) => text.push_str(&format!(
            "\n  lease holder {holder} until {}",
            field("lease_expires")
        )),
        None => {}
    }

    match report["pending_effect"].as_str() {
        Some(effect) => text.push_str(&format!(
            "\n  pending effect {effect} (a write started and was not recorded)"
        )),
        None => text.push_str("\n  pending effect none"),
    }
    text.push_str(&format!(
        "\n  created {}, updated {}",
        field("created"),
        field("updated")
    ));
    text
}

pub(crate) async fn status(cx: &Context, args: RunIdArgs) -> anyhow::Result<ExitCode> {
    // The same shape `GET /v1/runs/{id}` answers, plus a waiting run's decision (R12).
    let mut report = run_report(cx, &args.run_id).await?;
    if report["status"] == "waiting_for_approval"
        && let Some(decision) = super::decisions::pending_of(cx, &args.run_id).await?
    {
        report["decision"] = decision;
    }
    output::emit(cx.json, &report, || {
        let mut text = status_text(&report);
        if report.get("decision").is_some() {
            let decision = crate::decisions::decision_text(&report["decision"]);
            text.push_str(&format!("\n  waiting for {decision}"));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn events(cx: &Context, args: EventsArgs) -> anyhow::Result<ExitCode> {
    match &cx.server {
        Some(server) => events_from_server(cx, server, args).await,
        None => events_from_store(cx, args).await,
    }
}

/// Through the API: one JSON answer, or with `--follow` the run's Server-Sent Events,
/// which the server pushes as they are stored.
async fn events_from_server(
    cx: &Context,
    server: &crate::client::ApiClient,
    args: EventsArgs,
) -> anyhow::Result<ExitCode> {
    let report = run_report(cx, &args.run_id).await?; // a clear answer for an unknown id
    if args.follow && report["status"] == RunState::Queued.as_str() {
        eprintln!("{}", waiting_line(&args.run_id));
    }
    if !args.follow {
        let answer = server
            .get(&format!("/v1/runs/{}/events?after=0", args.run_id))
            .await?;
        let body = server.expect(answer).await?;
        for event in body["events"].as_array().into_iter().flatten() {
            print_event(cx.json, &event_from_json(event));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut after = 0;
    loop {
        let mut saw_final = false;
        after = server
            .follow(&args.run_id, after, |event| {
                let event = event_from_json(event);
                saw_final |= is_final_kind(&event.kind);
                print_event(cx.json, &event);
            })
            .await?;
        // The server ends a stream after the final event, after a terminal run's grace,
        // or when it drains: only the last needs a new stream, which resumes after `after`.
        let status = run_report(cx, &args.run_id).await?["status"]
            .as_str()
            .and_then(RunState::parse);
        if saw_final || status.is_none_or(RunState::is_terminal) {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// From the store, opened once. With `--follow` it waits on the store's change feed
/// and reads only when the run changed; a change another process made on a shared
/// SQLite file arrives as a resync within [`crate::root::OTHER_WRITERS_EVERY`].
async fn events_from_store(cx: &Context, args: EventsArgs) -> anyhow::Result<ExitCode> {
    let runs = cx.root.runs().await?;
    // Subscribed before the first read, so no change after that read is missed.
    let mut feed = runs.change_feed().subscribe();
    if args.follow {
        cx.root.watch_other_writers().await?;
    }
    let Some(run) = runs.run_get(&args.run_id).await? else {
        bail!("no run with id {}", args.run_id);
    };
    if args.follow && run.status == RunState::Queued {
        // Not silent while nothing can happen: say what the run waits for.
        eprintln!("{}", waiting_line(&args.run_id));
        if let Some(hint) = crate::hints::no_worker_hint(&*cx.root.queue().await?).await {
            eprintln!("{hint}");
        }
    }
    let mut after = 0;
    let mut ended_at: Option<Instant> = None;
    loop {
        let events = runs.run_events(&args.run_id, after, 0).await?;
        let mut saw_final = false;
        for event in &events {
            print_event(cx.json, event);
            after = event.seq;
            saw_final |= is_final_kind(&event.kind);
        }
        if !args.follow || saw_final {
            return Ok(ExitCode::SUCCESS);
        }
        let status = runs.run_get(&args.run_id).await?.map(|run| run.status);
        if status.is_none_or(RunState::is_terminal) {
            // A segment may still write its last step; give it a moment, then stop.
            let since = *ended_at.get_or_insert_with(Instant::now);
            if since.elapsed() > TERMINAL_GRACE {
                return Ok(ExitCode::SUCCESS);
            }
        }
        let grace_over = async {
            match ended_at {
                Some(since) => tokio::time::sleep_until((since + TERMINAL_GRACE).into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            news = news_of(&mut feed, &args.run_id) => {
                if news == News::Closed {
                    bail!("the store closed while following run {}", args.run_id);
                }
            }
            () = grace_over => {}
        }
    }
}

/// What `events --follow` says about a run no worker has claimed yet.
fn waiting_line(run_id: &str) -> String {
    format!("run {run_id} is queued: waiting for a worker to claim it")
}

/// After a run is terminal with no final event yet, how long its segment may still write
/// one before `events --follow` stops anyway.
const TERMINAL_GRACE: Duration = Duration::from_secs(3);
