//! The demo's tour: a run cancelled mid-write on one server, then a write that waits for
//! an operator on another; the timeline as it happens, then what was checked.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use runwarden_runtime::{
    CancelHub, Executor, ExecutorConfig, Observer, Outcome, Run, RunEvent, StatusWatcher,
    WatcherConfig,
};
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{AuditRow, VerifyReport};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

use super::mcp_server::{self, DemoServer, SLOW_CALL, SLOW_TOOL, ServerEvent};
use super::{
    AGENT, ApprovalAct, CLOSE_GRACE, DESK, PROMPT, SERVER, Seen, TOUR_BOUND, Watch, agent,
    approval_act, audit_view, cancel_after_a_beat, import, install, millis, summary,
};
use crate::output;

/// What the tour found, for its checks and its report.
struct Findings {
    watch: Watch,
    /// How the first run's execution returned, if it did.
    outcome: Option<Outcome>,
    /// The first run's row at the end.
    row: Run,
    /// The first run's audit rows.
    rows: Vec<AuditRow>,
    verify: VerifyReport,
    act: ApprovalAct,
}

pub(super) async fn tour(json: bool, dir: &Path, keep: bool) -> anyhow::Result<ExitCode> {
    let (seen, mut inbox) = unbounded_channel::<Seen>();
    let to_inbox = seen.clone();
    let server = mcp_server::start(
        SLOW_CALL,
        Arc::new(move |event| {
            let _ = to_inbox.send(Seen::Server(event));
        }),
    )
    .await?;
    let (desk, desk_calls) = counting_desk().await?;
    let at = install(dir, &server.url, &desk.url).await?;
    let imported = import(&at, SERVER).await?;
    import(&at, DESK).await?;
    let agent = agent(&at, AGENT).await?;
    let watcher = StatusWatcher::new(
        at.store.clone(),
        Arc::new(CancelHub::new()),
        WatcherConfig::default(),
    );
    let executor = Arc::new(Executor::new(
        at.store.clone(),
        watcher,
        ExecutorConfig::new("demo"),
    ));
    let start = Instant::now();
    let run = executor
        .create_sync(&agent.name, PROMPT)
        .await
        .context("while creating the demo run")?;
    if !json {
        output::line(intro(&server, &desk, &imported, &run.id));
    }
    let steps = seen.clone();
    let observer: Observer = Arc::new(move |event: &RunEvent| {
        let _ = steps.send(Seen::Step(event.clone(), Instant::now()));
    });
    let execution = {
        let (executor, run) = (executor.clone(), run.clone());
        tokio::spawn(async move { executor.execute(&run, &agent, PROMPT, Some(observer)).await })
    };
    let follow = Follow {
        json,
        start,
        executor: &executor,
        run_id: &run.id,
        seen: &seen,
    };
    let (watch, outcome) = follow.until_done(&mut inbox, execution).await;
    drop(server);

    let row = at
        .store
        .run_get(&run.id)
        .await?
        .context("the demo run vanished from the store")?;
    let rows = at
        .vault
        .audit_list(AuditFilter {
            action: None,
            correlation: Some(run.id.clone()),
            after_id: None,
            newest_first: false,
            limit: 0,
        })
        .await?;
    let act = approval_act(&at, &executor, &desk_calls).await?;
    drop(desk);
    let verify = at.vault.audit_verify().await?;
    let mut found = Findings {
        watch,
        outcome,
        row,
        rows,
        verify,
        act,
    };
    let problems = problems(&found);
    found.watch.problems.extend(problems);
    if json {
        output::line(report_json(&found, start, &run.id, dir, keep));
    } else {
        report_text(&found);
    }
    Ok(if found.watch.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The second act's server, which counts the create_ticket calls it answers.
async fn counting_desk() -> anyhow::Result<(DemoServer, Arc<AtomicUsize>)> {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let desk = mcp_server::start(
        std::time::Duration::ZERO,
        Arc::new(move |event| {
            if let ServerEvent::CallArrived { tool, .. } = event
                && tool == SLOW_TOOL
            {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        }),
    )
    .await?;
    Ok((desk, calls))
}

/// The lines before the timeline: the two servers, their tools and the run.
fn intro(
    server: &DemoServer,
    desk: &DemoServer,
    imported: &[(String, &'static str)],
    run_id: &str,
) -> String {
    let tools: Vec<String> = imported
        .iter()
        .map(|(name, effect)| {
            if name.ends_with(SLOW_TOOL) {
                format!("{name} ({effect}, answers in {} s)", SLOW_CALL.as_secs())
            } else {
                format!("{name} ({effect})")
            }
        })
        .collect();
    format!(
        "runwarden demo: a throwaway installation and two MCP servers on 127.0.0.1:\n\
         {SERVER} at {} (its tools: {}), for a run that is cancelled mid-write\n\
         {DESK} at {} (the same tools; {DESK}__create_ticket needs an operator's approval)\n\
         run {run_id} of a scripted agent: look Ada up, then file a ticket\n\n\
         {:>8}  what happened",
        server.url,
        tools.join(", "),
        desk.url,
        "ms"
    )
}

/// Follows the first run as it happens: each step, what the server saw, the cancel.
struct Follow<'a> {
    json: bool,
    start: Instant,
    executor: &'a Arc<Executor>,
    run_id: &'a str,
    seen: &'a UnboundedSender<Seen>,
}

impl Follow<'_> {
    /// Prints the timeline until the run has ended and the server has reported the close
    /// (or it is clearly not coming), issuing the cancel once the slow call is on the wire.
    async fn until_done(
        &self,
        inbox: &mut UnboundedReceiver<Seen>,
        mut execution: JoinHandle<Outcome>,
    ) -> (Watch, Option<Outcome>) {
        let mut watch = Watch::default();
        let mut outcome: Option<Outcome> = None;
        let mut run_ended: Option<Instant> = None;
        let mut cancel_scheduled = false;
        let bound = tokio::time::sleep(TOUR_BOUND);
        tokio::pin!(bound);
        loop {
            // Once the run has ended its observer has sent every step: drain them, then
            // stop when the server has reported the close (or it is clearly not coming).
            if let Some(ended) = run_ended
                && (watch.closed.is_some() || ended.elapsed() >= CLOSE_GRACE)
                && inbox.is_empty()
            {
                break;
            }
            let next = tokio::select! {
                Some(next) = inbox.recv() => next,
                result = &mut execution, if outcome.is_none() => {
                    outcome = Some(result.unwrap_or(Outcome::Failed));
                    run_ended = Some(Instant::now());
                    continue;
                }
                () = tokio::time::sleep(CLOSE_GRACE), if run_ended.is_some() => continue,
                () = &mut bound => {
                    watch.problems.push(format!("the tour did not end within {} s", TOUR_BOUND.as_secs()));
                    execution.abort();
                    break;
                }
            };
            if let Seen::Server(ServerEvent::CallArrived { tool, .. }) = &next
                && tool == SLOW_TOOL
                && !cancel_scheduled
            {
                cancel_scheduled = true;
                let (executor, run_id) = (self.executor.clone(), self.run_id.to_owned());
                cancel_after_a_beat(executor, run_id, self.seen.clone());
            }
            let entry = watch.entry(next);
            if !self.json && !entry.quiet {
                output::line(format!(
                    "{:>8.1}  {}",
                    millis(self.start, entry.at),
                    entry.text
                ));
            }
            watch.timeline.push(entry);
        }
        (watch, outcome)
    }
}

/// How long from the cancel to the server seeing the transfer closed, in ms.
fn cancel_to_close(watch: &Watch) -> Option<f64> {
    watch
        .cancel_issued
        .zip(watch.closed)
        .map(|(c, t)| millis(c, t))
}

/// What the tour should have shown and did not.
fn problems(found: &Findings) -> Vec<String> {
    let (row, act) = (&found.row, &found.act);
    let mut problems = Vec::new();
    let status = row.status.as_str();
    if found.watch.cancel_issued.is_none() {
        problems.push(format!(
            "the {SLOW_TOOL} call never reached the server, so nothing was cancelled on the wire"
        ));
    } else if cancel_to_close(&found.watch).is_none() {
        problems.push(format!(
            "the server did not see the {SLOW_TOOL} transfer torn down"
        ));
    }
    if status != "cancelled" {
        problems.push(format!("the run ended {status}, not cancelled"));
    }
    if row.pending_effect.as_deref() != Some("non_idempotent_write") {
        problems.push("the run carries no non_idempotent_write fence".into());
    }
    if !found
        .rows
        .iter()
        .any(|r| r.event.action == "http_call_cancelled")
    {
        problems.push("no http_call_cancelled row was audited".into());
    }
    if !found.verify.intact {
        problems.push("the audit chain does not verify".into());
    }
    if act.parked != Outcome::WaitingForApproval || act.calls_while_waiting != 0 {
        problems.push("the write did not wait for the approval".into());
    }
    if act.outcome != Outcome::Completed || act.calls_after != 1 {
        problems.push(format!(
            "after the approval the run ended {} and the server saw {}, not 1",
            act.outcome.as_str(),
            output::count(act.calls_after as u64, "call", "calls")
        ));
    }
    problems
}

/// `demo --json`: the timeline, the cancel's timings, the run's end, its audit rows and
/// the second act.
fn report_json(found: &Findings, start: Instant, run_id: &str, dir: &Path, keep: bool) -> Value {
    let (watch, row, act) = (&found.watch, &found.row, &found.act);
    let events: Vec<Value> = watch
        .timeline
        .iter()
        .map(|e| json!({ "ms": millis(start, e.at), "source": e.source, "kind": e.kind, "text": e.text }))
        .collect();
    json!({
        "ok": watch.problems.is_empty(),
        "problems": watch.problems,
        "run_id": run_id,
        "mcp_server": SERVER,
        "data_dir": dir.display().to_string(),
        "kept": keep,
        "events": events,
        "cancel_issued_ms": watch.cancel_issued.map(|c| millis(start, c)),
        "cancel_returned_ms": watch.cancel_returned.map(|c| millis(start, c)),
        "transfer_closed_ms": watch.closed.map(|c| millis(start, c)),
        "cancel_to_close_ms": cancel_to_close(watch),
        "outcome": found.outcome.map(Outcome::as_str),
        "status": row.status.as_str(),
        "termination_reason": row.termination_reason,
        "pending_effect": row.pending_effect,
        "audit": found.rows.iter().map(audit_view).collect::<Vec<_>>(),
        "audit_verify": found.verify,
        "approval": {
            "run_id": act.run_id,
            "decision_id": act.decision_id,
            "parked": act.parked.as_str(),
            "calls_while_waiting": act.calls_while_waiting,
            "outcome": act.outcome.as_str(),
            "calls_after": act.calls_after,
        },
    })
}

/// The lines after the timeline for people, and what went wrong on stderr.
fn report_text(found: &Findings) {
    let (row, act) = (&found.row, &found.act);
    summary(
        row.status.as_str(),
        row.pending_effect.as_deref(),
        &found.rows,
        &found.verify,
    );
    output::line(format!(
        "\napproval  run {}: {DESK}__create_ticket needs an operator; the run waits ({}), the server saw {}\n          decision {} approved by demo; the run resumed: {}, the server saw {} (once)",
        act.run_id,
        act.parked.as_str(),
        output::count(act.calls_while_waiting as u64, "call", "calls"),
        act.decision_id,
        act.outcome.as_str(),
        output::count(act.calls_after as u64, "call", "calls")
    ));
    if !found.watch.problems.is_empty() {
        eprintln!(
            "error: the demo did not show what it should: {}",
            found.watch.problems.join("; ")
        );
    }
}
