//! `runwarden enqueue`, `worker`, `reap`: queued runs, the processes that claim them, and
//! the reaper on demand.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::Args;
use runwarden_runtime::idempotency::check_key;
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{KeyedCreate, RequeueAnswer, RunCreateKeyed, reap};
use serde_json::json;

use super::Context;
use crate::output;

#[derive(Debug, Args)]
pub(crate) struct EnqueueArgs {
    /// The agent, from [agents.NAME].
    #[arg(long)]
    agent: String,
    /// What to ask the agent.
    prompt: String,
    #[command(flatten)]
    budgets: super::run::BudgetArgs,
    #[command(flatten)]
    tags: super::run::TagArgs,
    /// Makes the enqueue safe to retry: the same key with the same request answers the
    /// run the first one made (kept 24 h); with another request it is refused.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// Runs executed at once [default: [worker] concurrency].
    #[arg(long)]
    concurrency: Option<usize>,
}

/// The row is the state: the stored request is all a worker needs.
pub(crate) async fn enqueue(cx: &Context, args: EnqueueArgs) -> anyhow::Result<ExitCode> {
    if let Some(server) = &cx.server {
        // The server checks the budgets against its own configuration of the agent.
        let run = server
            .enqueue(
                &args.agent,
                &args.prompt,
                &args.budgets.asked(),
                &args.tags.checked()?,
                args.idempotency_key.as_deref(),
            )
            .await?;
        let report = json!({ "run_id": run["run_id"], "status": run["status"] });
        let id = run["run_id"].as_str().unwrap_or_default().to_string();
        output::emit(cx.json, &report, || id);
        return Ok(ExitCode::SUCCESS);
    }
    let budgets = args.budgets.checked(cx.config.agent(&args.agent)?)?;
    let tags = args.tags.checked()?;
    let store = cx.store().await?;
    let id = uuid::Uuid::now_v7().to_string();
    let create = RunCreate {
        id: id.clone(),
        agent: args.agent.clone(),
        correlation: id.clone(),
        request: Some(runwarden_runtime::run_request(&args.prompt, &budgets)),
        status: NewRunStatus::Queued,
        now_ms: chrono::Utc::now().timestamp_millis(),
        // Stored on this machine's command line: no token started it.
        origin: runwarden_runtime::RunOrigin {
            started_by: None,
            tags,
        },
    };
    let run = match &args.idempotency_key {
        None => store
            .run_create(create)
            .await
            .context("while storing the queued run")?,
        Some(key) => {
            check_key(key).map_err(anyhow::Error::msg)?;
            let body_hash = crate::views::run_request_hash(
                &args.agent,
                &args.prompt,
                "queued",
                &budgets,
                &create.origin.tags,
            );
            let keyed = RunCreateKeyed {
                run: create,
                // The command line's keys are its own: an API token's never answer them.
                scope: "cli".into(),
                key: key.clone(),
                body_hash,
            };
            match store
                .run_create_keyed(keyed)
                .await
                .context("while storing the queued run")?
            {
                KeyedCreate::Created(run) | KeyedCreate::Existing(run) => run,
                KeyedCreate::Reused { run_id } => bail!(
                    "idempotency key {key:?} already made run {run_id} from a different request: use a new key for a new run"
                ),
            }
        }
    };
    output::emit(
        cx.json,
        &json!({ "run_id": run.id, "status": run.status.as_str() }),
        || run.id.clone(),
    );
    if let Some(hint) = crate::hints::no_worker_hint(&*store).await {
        eprintln!("{hint}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn worker(cx: &Context, args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let stop = super::signals::stop_levels(); // before any work: an early SIGTERM drains
    crate::root::warn_if_unsynced(&cx.config);
    if cx.root.backend_when_room(stop.clone()).await?.is_none() {
        return Ok(ExitCode::SUCCESS); // stopped while waiting for room: nothing was claimed
    }
    let settings = &cx.config.worker;
    let concurrency = args.concurrency.unwrap_or(settings.concurrency).max(1);
    let executor = cx.root.executor("worker", true, None).await?;
    let agents = cx.root.agents("worker").await?;
    // O6: runs enqueued by other processes on a shared SQLite file wake this worker.
    cx.root.watch_other_writers().await?;
    let json = cx.json;
    let observer: runwarden_runtime::OutcomeObserver = Arc::new(move |run, outcome| {
        if json {
            output::line(
                json!({ "run_id": run.id, "agent": run.agent, "outcome": outcome.as_str() }),
            );
        } else {
            output::line(format!(
                "run {} ({}) {}",
                run.id,
                run.agent,
                outcome.as_str()
            ));
        }
    });
    if !cx.json {
        eprintln!(
            "worker {} claiming queued runs (concurrency {}, lease {:.1} s); Ctrl-C or SIGTERM stops it",
            executor.owner(),
            concurrency,
            settings.lease.as_secs_f64()
        );
    }
    let worker = cx.root.worker(executor, agents, concurrency).await?;
    let worker = Arc::new(worker.with_observer(observer));
    let summary = worker.run(stop).await;
    let outcomes: serde_json::Map<String, serde_json::Value> = summary
        .outcomes
        .iter()
        .map(|(o, n)| (o.as_str().to_string(), json!(n)))
        .collect();
    let report = json!({ "stopped": true, "claimed": summary.claimed, "outcomes": outcomes, "rescued": summary.rescued, "abandoned": summary.abandoned });
    if cx.json {
        output::line(report);
    } else {
        eprintln!(
            "worker stopped: {} claimed, {} recovered by its reaper, {} still running left to their leases",
            output::count(summary.claimed as u64, "run", "runs"),
            summary.rescued,
            summary.abandoned
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn reap_once(cx: &Context) -> anyhow::Result<ExitCode> {
    let queue = cx.root.queue().await?;
    let rescued = reap(&*queue, &cx.config.worker.retry())
        .await
        .context("while reaping stale runs")?;
    let rows: Vec<serde_json::Value> = rescued
        .iter()
        .map(|r| {
            let action = match r.action {
                RequeueAnswer::Requeued { requeue_count } => {
                    format!("requeued (attempt {})", requeue_count + 1)
                }
                RequeueAnswer::DeadLettered(reason) => format!("dead-lettered {}", reason.as_str()),
                RequeueAnswer::AlreadyCancelled => "already cancelled".into(),
                RequeueAnswer::LeaseLost => "taken by another".into(),
            };
            json!({ "run_id": r.id, "action": action })
        })
        .collect();
    output::emit(cx.json, &rows, || {
        if rows.is_empty() {
            return "no stale runs".into();
        }
        rows.iter()
            .map(|r| {
                format!(
                    "run {} {}",
                    r["run_id"].as_str().unwrap_or_default(),
                    r["action"].as_str().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(ExitCode::SUCCESS)
}
