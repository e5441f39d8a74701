//! `runwarden demo`: a self-contained tour. A throwaway installation, a local MCP server
//! with a slow non-idempotent tool, the scripted model; a run is cancelled while that
//! tool's call is on the wire, and the timeline shows how fast the transfer was torn down,
//! the run's status, its write fence and the audit rows.

mod mcp_server;
mod tour;

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::root::{Backend, Store};
use crate::store_url::StoreUrl;
use anyhow::{Context as _, bail};
use clap::Args;
use runwarden_mcp::{McpClient, Reply, Request, SchemaStatus, build_catalogue};
use runwarden_models::Scripted;
use runwarden_runtime::{
    AgentSpec, CancelAnswer, Executor, Outcome, RunEvent, bind_tools, clamp_rounds,
};
use runwarden_vault::{AuditRow, EgressClient, Vault, VerifyReport};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use self::mcp_server::{SLOW_CALL, SLOW_TOOL, ServerEvent};
use crate::config::{Config, ProviderConfig};
use crate::installation::create_installation;
use crate::output;
use crate::views::event_line;

/// The MCP server's name in the demo's configuration.
const SERVER: &str = "helpdesk";
/// The agent's name in the demo's configuration.
const AGENT: &str = "helpdesk";
const PROMPT: &str = "Ada (ada@example.com) says the printer on floor 3 is jammed: file a ticket.";

/// The scripted model's plan: look the user up, open a ticket, answer.
const PLAN: &str = r#"[
  {"tool_calls": [{"name": "helpdesk__lookup_user", "arguments": {"email": "ada@example.com"}}]},
  {"tool_calls": [{"name": "helpdesk__create_ticket", "arguments": {"user": "ada@example.com", "title": "Printer on floor 3 is jammed"}}]},
  {"text": "Ticket filed for Ada."}
]
"#;

/// The second act's server (its `create_ticket` answers at once) and agent, whose
/// `approve` makes that write wait for an operator.
const DESK: &str = "desk";
const APPROVER: &str = "approver";
const APPROVER_PLAN: &str = r#"[
  {"tool_calls": [{"name": "desk__create_ticket", "arguments": {"user": "ada@example.com", "title": "Printer on floor 3 is jammed"}}]},
  {"text": "Ticket filed for Ada, after an operator approved it."}
]
"#;

/// How long the reader gets to see the call hang before the operator cancels it.
const BEAT: Duration = Duration::from_millis(300);
/// The whole tour ends well within this, or something is wrong.
const TOUR_BOUND: Duration = Duration::from_secs(15);
/// After the run ended, how long to wait for the server to report the closed transfer.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Keep the temporary installation and print its path.
    #[arg(long)]
    keep: bool,
}

/// Something the tour saw, as it happened.
enum Seen {
    Step(RunEvent, Instant),
    Server(ServerEvent),
    CancelIssued(Instant),
    CancelReturned(Instant, Result<CancelAnswer, String>),
}

/// One line of the timeline.
struct Entry {
    at: Instant,
    source: &'static str,
    kind: String,
    text: String,
    /// Left out of the human timeline (the fast tool's server side); JSON keeps it.
    quiet: bool,
}

/// The config the demo writes: loopback allowed, the helpdesk server, the scripted agent.
fn config_text(url: &str, desk_url: &str) -> String {
    format!(
        r#"# Written by `runwarden demo`: a throwaway installation.
data_dir = "data"

[egress]
allow = ["127.0.0.1"]

[mcp.servers.{SERVER}]
url = "{url}"
# create_ticket takes 30 s to answer: give the call room, the demo cancels it anyway.
timeout_seconds = 60
# The demo's servers speak the 2025-11-25 session protocol: no 2026-07-28 probe (M19).
protocol = "2025-11-25"
# Every other tool keeps the default effect, non_idempotent_write: a write that is never
# retried once it may have reached the server.
[mcp.servers.{SERVER}.tools.lookup_user]
effect = "read_only"

[agents.{AGENT}]
provider = "scripted"
script = "plan.json"
tools = ["{SERVER}__*"]
max_rounds = 5

# The second act: the same kind of server, answering at once, behind an approval (R12).
[mcp.servers.{DESK}]
url = "{desk_url}"
protocol = "2025-11-25"

[agents.{APPROVER}]
provider = "scripted"
script = "approve.json"
tools = ["{DESK}__create_ticket"]
approve = ["{DESK}__create_ticket"]
max_rounds = 5
"#
    )
}

/// Everything the tour's run needs, in the temporary installation.
struct Installation {
    config: Config,
    vault: Arc<Vault>,
    store: Arc<dyn Store>,
    egress: Arc<EgressClient>,
}

/// Writes the config and the plan, then creates what `init` creates.
async fn install(dir: &Path, url: &str, desk_url: &str) -> anyhow::Result<Installation> {
    let path = dir.join("runwarden.toml");
    std::fs::write(&path, config_text(url, desk_url))
        .with_context(|| format!("while writing {}", path.display()))?;
    std::fs::write(dir.join("plan.json"), PLAN).context("while writing the plan")?;
    std::fs::write(dir.join("approve.json"), APPROVER_PLAN)
        .context("while writing the second plan")?;
    let mut config = Config::load(&path)?;
    // The tour must never touch an operator's installation: undo any RUNWARDEN_*
    // override of where data lives and what egress allows.
    config.data_dir = dir.join("data");
    config.store = StoreUrl::Sqlite(config.data_dir.join("runwarden.db"));
    config.master_key_file = config.data_dir.join("master.key");
    config.egress_allow = vec!["127.0.0.1".into()];
    // The vault comes straight from the new key, never from $RUNWARDEN_MASTER_KEY.
    let vault = Arc::new(create_installation(&config).await?);
    let store = Backend::open(&config, false).await?.store();
    let egress = Arc::new(EgressClient::new(vault.clone(), config.egress()?));
    Ok(Installation {
        config,
        vault,
        store,
        egress,
    })
}

/// `runwarden mcp import NAME`, in process: the catalogue with the operator's effects.
async fn import(at: &Installation, name: &str) -> anyhow::Result<Vec<(String, &'static str)>> {
    let server = at.config.mcp_server(name)?;
    let client = McpClient::new(server.clone(), at.egress.clone())
        .with_actor("demo")
        .with_health(at.store.clone());
    let tools = match client.send_request(Request::ListTools, None).await {
        Ok(Reply::Tools(tools)) => tools,
        Ok(_) => bail!("server {name} answered tools/list with something else"),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("while importing the catalogue of server {name}"));
        }
    };
    // M13: the import's session ends here; the run builds its own clients.
    if let Err(error) = client.close().await {
        tracing::info!(%error, "could not end the demo import's MCP session");
    }
    let entries = build_catalogue(server, &tools, chrono::Utc::now().timestamp_millis());
    at.store
        .catalogue_replace(name, entries.clone())
        .await
        .with_context(|| format!("while storing the catalogue of server {name}"))?;
    Ok(entries
        .iter()
        .filter(|e| matches!(e.schema, SchemaStatus::Usable(_)))
        .map(|e| (e.local_name.clone(), e.effect.as_str()))
        .collect())
}

/// The agent as `runwarden run --agent NAME` would build it.
async fn agent(at: &Installation, name: &str) -> anyhow::Result<AgentSpec> {
    let config = at.config.agent(name)?;
    let ProviderConfig::Scripted { script } = &config.provider else {
        bail!("the demo's agent is not scripted");
    };
    let provider = Scripted::from_file(script)
        .context("while loading the demo's plan")?
        .guarded_by(at.egress.clone());
    let clients: HashMap<String, Arc<McpClient>> = at
        .config
        .mcp_servers
        .values()
        .map(|server| {
            let client = McpClient::new(server.clone(), at.egress.clone())
                .with_actor("run")
                .with_health(at.store.clone());
            (server.name.clone(), Arc::new(client))
        })
        .collect();
    let catalogue = at.store.catalogue_list(None).await?;
    let mut tools = bind_tools(&config.tools, &catalogue, |server| {
        clients.get(server).cloned()
    })
    .map_err(anyhow::Error::msg)
    .context("while binding the demo agent's tools")?;
    for tool in &mut tools {
        tool.approval = at.config.approval_of(
            config,
            &tool.client.server().name,
            &tool.remote_name,
            &tool.spec.name,
        );
    }
    Ok(AgentSpec {
        name: name.to_string(),
        system: config.system.clone(),
        max_rounds: clamp_rounds(config.max_rounds),
        provider: Arc::new(provider),
        tools,
        max_tokens: None,
        budgets: runwarden_runtime::Budgets::default(),
        policy: None,
        tags: Vec::new(),
    })
}

fn millis(from: Instant, to: Instant) -> f64 {
    // Tenths of a millisecond: a cancel on this machine takes about one.
    (to.saturating_duration_since(from).as_secs_f64() * 10_000.0).round() / 10.0
}

/// What the run's audit rows say, compactly.
fn audit_view(row: &AuditRow) -> Value {
    let e = &row.event;
    json!({
        "id": row.id, "action": e.action, "success": e.success, "method": e.method,
        "host": e.host, "path": e.path, "status": e.status, "duration_ms": e.duration_ms,
        "actor": e.actor,
    })
}

/// The whole tour; the temporary directory lives as long as this call.
pub(crate) async fn run(json: bool, args: DemoArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("runwarden-demo-")
        .tempdir()
        .context("while creating a temporary directory for the demo")?;
    let code = tour::tour(json, dir.path(), args.keep).await;
    if args.keep {
        let kept = dir.keep();
        if !json {
            output::line(format!(
                "kept {} (try: runwarden --config {}/runwarden.toml audit list)",
                kept.display(),
                kept.display()
            ));
        }
    }
    code
}

/// What the second act did.
struct ApprovalAct {
    run_id: String,
    decision_id: String,
    parked: Outcome,
    calls_while_waiting: usize,
    outcome: Outcome,
    calls_after: usize,
}

/// A write that waits for an operator. The run parks before anything is sent, the
/// demo approves it (as `runwarden approve` would, audited), and the resumed run makes
/// the call once.
async fn approval_act(
    at: &Installation,
    executor: &Executor,
    calls: &std::sync::atomic::AtomicUsize,
) -> anyhow::Result<ApprovalAct> {
    use std::sync::atomic::Ordering;
    let agent = agent(at, APPROVER).await?;
    let run = executor
        .create_sync(&agent.name, PROMPT)
        .await
        .context("while creating the approval run")?;
    let parked = executor.execute(&run, &agent, PROMPT, None).await;
    let calls_while_waiting = calls.load(Ordering::SeqCst);
    let pending = at
        .store
        .decision_list(runwarden_runtime::DecisionFilter {
            run_id: Some(run.id.clone()),
            ..Default::default()
        })
        .await?;
    let decision = pending
        .first()
        .context("the approval run asked no decision")?;
    let request = runwarden_runtime::AnswerRequest {
        answer: Some(runwarden_runtime::Answer::Approve),
        ..Default::default()
    };
    crate::decisions::answer(
        &*at.store,
        &*at.store,
        &at.vault,
        &decision.id,
        request,
        "demo",
    )
    .await?;
    // What a worker does: claim the queued run and resume it.
    let now = chrono::Utc::now().timestamp_millis();
    let claim = runwarden_runtime::queue::Claim {
        owner: executor.owner().to_string(),
        lease_until_ms: now + executor.lease_ms(),
        now_ms: now,
        agents: None,
        start: false,
    };
    let claimed = at
        .store
        .run_claim(claim)
        .await?
        .context("the approved run was not queued")?;
    let outcome = executor.execute(&claimed, &agent, PROMPT, None).await;
    Ok(ApprovalAct {
        run_id: run.id,
        decision_id: decision.id.clone(),
        parked,
        calls_while_waiting,
        outcome,
        calls_after: calls.load(Ordering::SeqCst),
    })
}

/// What the tour has seen so far.
#[derive(Default)]
struct Watch {
    timeline: Vec<Entry>,
    cancel_issued: Option<Instant>,
    cancel_returned: Option<Instant>,
    closed: Option<Instant>,
    problems: Vec<String>,
}

impl Watch {
    /// Notes what was seen and returns it as a line of the timeline.
    fn entry(&mut self, seen: Seen) -> Entry {
        match seen {
            Seen::Step(event, at) => Entry {
                at,
                source: "run",
                kind: event.kind.clone(),
                text: event_line(&event),
                quiet: false,
            },
            Seen::Server(ServerEvent::CallArrived { tool, at }) => {
                let text = if tool == SLOW_TOOL {
                    format!(
                        "server: tools/call {tool} arrived; it would answer in {} s",
                        SLOW_CALL.as_secs()
                    )
                } else {
                    format!("server: tools/call {tool} arrived")
                };
                Entry {
                    at,
                    source: "server",
                    kind: "call_arrived".into(),
                    text,
                    quiet: tool != SLOW_TOOL,
                }
            }
            Seen::Server(ServerEvent::CallAnswered { tool, at }) => Entry {
                at,
                source: "server",
                kind: "call_answered".into(),
                text: format!("server: answered {tool}"),
                quiet: tool != SLOW_TOOL,
            },
            Seen::Server(ServerEvent::CallClosed { tool, at }) => {
                self.closed.get_or_insert(at);
                let after = self
                    .cancel_issued
                    .map(|c| format!(" (+{:.1} ms after the cancel)", millis(c, at)))
                    .unwrap_or_default();
                Entry {
                    at,
                    source: "server",
                    kind: "transfer_torn_down".into(),
                    text: format!(
                        "server: the {tool} transfer was torn down before its answer{after}"
                    ),
                    quiet: false,
                }
            }
            Seen::Server(ServerEvent::CancelledNotice { at }) => Entry {
                at,
                source: "server",
                kind: "cancelled_notice".into(),
                text: "server: notifications/cancelled received (best-effort, never retried)"
                    .into(),
                quiet: false,
            },
            Seen::CancelIssued(at) => {
                self.cancel_issued = Some(at);
                Entry {
                    at,
                    source: "operator",
                    kind: "cancel_issued".into(),
                    text: "operator: cancel issued (as the API and the console issue it)".into(),
                    quiet: false,
                }
            }
            Seen::CancelReturned(at, answer) => {
                self.cancel_returned = Some(at);
                let text = self.cancel_answer_text(answer);
                Entry {
                    at,
                    source: "operator",
                    kind: "cancel_returned".into(),
                    text,
                    quiet: false,
                }
            }
        }
    }

    /// The operator's cancel as it returned; anything but a cancel is a problem of the tour.
    fn cancel_answer_text(&mut self, answer: Result<CancelAnswer, String>) -> String {
        match answer {
            Ok(CancelAnswer::Cancelled { previous }) => {
                format!(
                    "operator: cancel returned (the run was {})",
                    previous.as_str()
                )
            }
            Ok(CancelAnswer::AlreadyTerminal(state)) => {
                self.problems.push(format!(
                    "the cancel was refused: the run was already {}",
                    state.as_str()
                ));
                format!(
                    "operator: cancel refused (the run was already {})",
                    state.as_str()
                )
            }
            Ok(CancelAnswer::NotFound) => {
                self.problems.push("the cancel found no run".into());
                "operator: cancel found no run".into()
            }
            Err(error) => {
                self.problems.push(format!("the cancel failed: {error}"));
                format!("operator: cancel failed: {error}")
            }
        }
    }
}

/// The operator's cancel, issued once the call is on the wire.
fn cancel_after_a_beat(executor: Arc<Executor>, run_id: String, seen: UnboundedSender<Seen>) {
    tokio::spawn(async move {
        // Presentation, not synchronisation: the server has already told us the call is
        // on the wire; the pause only lets the reader see it hang.
        tokio::time::sleep(BEAT).await;
        let _ = seen.send(Seen::CancelIssued(Instant::now()));
        let answer = executor.cancel(&run_id).await.map_err(|e| e.to_string());
        let _ = seen.send(Seen::CancelReturned(Instant::now(), answer));
    });
}

/// The lines after the timeline: status, fence, audit rows, chain.
fn summary(status: &str, fence: Option<&str>, rows: &[AuditRow], verify: &VerifyReport) {
    output::line(format!("\nstatus    {status}"));
    match fence {
        Some(effect) => output::line(format!(
            "fence     pending_effect: {effect}: the ticket may or may not have been created; the call is never retried"
        )),
        None => output::line("fence     none"),
    }
    for (i, row) in rows.iter().enumerate() {
        let e = &row.event;
        output::line(format!(
            "{:<10}{:<21}{} {}{} {} {} ms",
            if i == 0 { "audit" } else { "" },
            e.action,
            e.method,
            e.host,
            e.path,
            if e.status == 0 {
                "-".to_string()
            } else {
                e.status.to_string()
            },
            e.duration_ms
        ));
    }
    output::line(match (&verify.first_bad_row, &verify.problem) {
        (Some(row), Some(problem)) => format!("verify    BROKEN at row {row}: {problem}"),
        _ => format!(
            "verify    intact: {}, chain and tip anchor verified",
            output::count(verify.rows_verified.max(0) as u64, "row", "rows")
        ),
    });
}
