//! `runwarden policy validate|eval|test`: the Cedar policies of `[policy] files` (or
//! `--files`), checked, asked about one call, or run against a table of expected
//! decisions for an operator's CI. They read the policy files without starting anything,
//! and work when the policies would refuse the start.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use runwarden_policy::{Decision, Policies, PolicyFile, Request, RunFacts, Target, Verdict};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{Config, policy_files, read_files};
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Check the policy files against the built-in schema; print every problem with its
    /// file and line. Exits 1 when one is found.
    Validate(FilesArg),
    /// Decide one tool call as a run would, and print the decision, the policies that
    /// determined it and why.
    Eval(EvalArgs),
    /// Run a TOML table of cases (`[[case]]` with `agent`, `tool`, `args`, `expect`) and
    /// print each as PASS or FAIL. Exits 1 when a case fails.
    Test(TestArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct FilesArg {
    /// Policy files or patterns (`policies/*.cedar`) relative to the current directory,
    /// instead of the configuration's `[policy] files`.
    #[arg(long, num_args = 1.., value_name = "PATTERN")]
    files: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct EvalArgs {
    /// The agent that calls.
    #[arg(long)]
    agent: String,
    /// The tool, by its local name SERVER__TOOL.
    #[arg(long, value_name = "SERVER__TOOL")]
    tool: String,
    /// The call's arguments, a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    args: String,
    /// The token or console user that started the run.
    #[arg(long)]
    token: Option<String>,
    /// The tool's effect: read_only, idempotent_write or non_idempotent_write. Default:
    /// as the configuration declares it for the tool.
    #[arg(long)]
    effect: Option<String>,
    #[command(flatten)]
    files: FilesArg,
}

#[derive(Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// The cases, a TOML file.
    file: PathBuf,
    #[command(flatten)]
    files: FilesArg,
}

pub(crate) fn run(json: bool, config: &Path, command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Validate(files) => validate(json, config, &files),
        PolicyCommand::Eval(args) => eval(json, config, args),
        PolicyCommand::Test(args) => test(json, config, args),
    }
}

/// The policy files `--files` names, else the configuration's.
fn files(config: &Path, arg: &FilesArg) -> anyhow::Result<Vec<PolicyFile>> {
    if !arg.files.is_empty() {
        let here = std::env::current_dir()?;
        return read_files(&arg.files, &here);
    }
    match policy_files(config)? {
        Some(files) => Ok(files),
        None => bail!(
            "{} has no [policy] section: add `[policy] files = [\"policies/*.cedar\"]`, or give --files",
            config.display()
        ),
    }
}

/// The configuration, when its file exists: an error in it is reported, never skipped,
/// so a check here never passes what `run` and `serve` refuse. `None` without a file
/// (policies checked with `--files` alone).
fn configuration(config: &Path) -> anyhow::Result<Option<Config>> {
    if !config.exists() {
        return Ok(None);
    }
    Config::load(config)
        .map(Some)
        .with_context(|| format!("{} does not load; fix it first", config.display()))
}

fn load(config: &Path, arg: &FilesArg) -> anyhow::Result<Policies> {
    let files = files(config, arg)?;
    Policies::from_files(&files).map_err(|e| anyhow::anyhow!(e.problems().join("\n")))
}

fn validate(json: bool, config: &Path, arg: &FilesArg) -> anyhow::Result<ExitCode> {
    let files = files(config, arg)?;
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    match Policies::from_files(&files) {
        Ok(policies) => {
            // Valid policies in a file `run` would refuse are not valid to an operator.
            configuration(config)?;
            if policies.is_empty() {
                eprintln!("note: no policies: every call will be denied (no policy permits it)");
            }
            let value =
                json!({"valid": true, "files": names, "policies": policies.ids(), "problems": []});
            output::emit(json, &value, || {
                format!(
                    "valid: {} in {}",
                    output::count(policies.len() as u64, "policy", "policies"),
                    output::count(files.len() as u64, "file", "files")
                )
            });
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            let problems = error.problems();
            let value =
                json!({"valid": false, "files": names, "policies": [], "problems": problems});
            output::emit(json, &value, || problems.join("\n"));
            Ok(ExitCode::FAILURE)
        }
    }
}

fn eval(json: bool, config: &Path, args: EvalArgs) -> anyhow::Result<ExitCode> {
    let policies = load(config, &args.files)?;
    let arguments: Value = serde_json::from_str(&args.args)
        .with_context(|| "--args is not JSON: write an object, like '{\"path\": \"/srv/a\"}'")?;
    let request = request(
        config,
        &args.agent,
        &args.tool,
        arguments,
        args.token,
        args.effect,
    )?;
    let verdict = policies.decide(&request);
    output::emit(json, &verdict_json(&verdict), || verdict_text(&verdict));
    Ok(ExitCode::SUCCESS)
}

/// `{"decision", "policies", "reasons"}`, exactly.
fn verdict_json(verdict: &Verdict) -> Value {
    json!({
        "decision": verdict.decision.as_str(),
        "policies": verdict.policies,
        "reasons": verdict.reasons,
    })
}

fn verdict_text(verdict: &Verdict) -> String {
    let mut lines = vec![verdict.decision.as_str().to_string()];
    if !verdict.policies.is_empty() {
        lines.push(format!("policies: {}", verdict.policies.join(", ")));
    }
    for reason in &verdict.reasons {
        lines.push(format!("reason: {reason}"));
    }
    lines.join("\n")
}

/// The request a run would ask about this call. The effect is the one given, else the
/// one the configuration declares for the tool, else the default for any MCP tool.
fn request(
    config: &Path,
    agent: &str,
    tool: &str,
    arguments: Value,
    token: Option<String>,
    effect: Option<String>,
) -> anyhow::Result<Request> {
    let Some((server, name)) = tool.split_once("__") else {
        bail!("{tool:?} is not a tool's local name: write SERVER__TOOL, like files__write");
    };
    let Value::Object(arguments) = arguments else {
        bail!("the arguments must be a JSON object, like '{{\"path\": \"/srv/a\"}}'");
    };
    let configured = configuration(config)?;
    if let Some(configured) = &configured
        && !configured.agents.contains_key(agent)
    {
        // Said, so a misspelt agent is not mistaken for what the policies decide.
        eprintln!(
            "note: no agent named {agent:?} in {}: deciding for an agent with no tags",
            config.display()
        );
    }
    let server_config = configured.as_ref().and_then(|c| c.mcp_servers.get(server));
    let effect = match effect {
        Some(word) => runwarden_mcp::Effect::parse(&word).with_context(|| {
            format!("effect {word:?} is not an effect: use read_only, idempotent_write or non_idempotent_write")
        })?,
        None => server_config.map_or_else(runwarden_mcp::Effect::default, |s| s.effect_of(name)),
    };
    let host = server_config
        .and_then(|s| url::Url::parse(&s.url).ok())
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_default();
    // The agent's tags as the configuration gives them (none for an agent it lacks).
    let agent_tags = (configured.as_ref().and_then(|c| c.agents.get(agent)))
        .map(|a| a.tags.clone())
        .unwrap_or_default();
    Ok(Request {
        agent: agent.to_string(),
        agent_tags,
        token,
        target: Target::Tool {
            id: tool.to_string(),
            server: server.to_string(),
            name: name.to_string(),
            effect: effect.as_str().to_string(),
        },
        arguments,
        run: RunFacts::default(),
        host,
    })
}

/// A `policy test` file: `[[case]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// Shown in the table; the tool when absent.
    name: Option<String>,
    agent: String,
    tool: String,
    #[serde(default)]
    args: Option<toml::Table>,
    token: Option<String>,
    effect: Option<String>,
    /// allow, deny or approval_required.
    expect: String,
    /// When given, the determining policies must be exactly these.
    policies: Option<Vec<String>>,
}

fn test(json: bool, config: &Path, args: TestArgs) -> anyhow::Result<ExitCode> {
    let policies = load(config, &args.files)?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read the cases {}", args.file.display()))?;
    let cases: Cases = toml::from_str(&text)
        .with_context(|| format!("while reading the cases {}", args.file.display()))?;
    let mut rows = Vec::new();
    let mut failed = 0;
    for (i, case) in cases.case.into_iter().enumerate() {
        let name = case
            .name
            .clone()
            .unwrap_or_else(|| format!("case {}: {}", i + 1, case.tool));
        let Some(expected) = Decision::parse(&case.expect) else {
            bail!(
                "{name}: expect = {:?} is not a decision: use allow, deny or approval_required",
                case.expect
            );
        };
        let arguments = serde_json::to_value(case.args.unwrap_or_default())?;
        let request = request(
            config,
            &case.agent,
            &case.tool,
            arguments,
            case.token,
            case.effect,
        )
        .with_context(|| name.clone())?;
        let verdict = policies.decide(&request);
        let ids_match = case.policies.as_ref().is_none_or(|ids| {
            let mut ids = ids.clone();
            ids.sort();
            ids == verdict.policies
        });
        let pass = verdict.decision == expected && ids_match;
        if !pass {
            failed += 1;
        }
        rows.push((name, pass, expected, case.policies, verdict));
    }
    let value = json!({
        "passed": rows.len() - failed,
        "failed": failed,
        "cases": rows.iter().map(|(name, pass, expected, _, verdict)| json!({
            "name": name,
            "pass": pass,
            "expected": expected.as_str(),
            "decision": verdict.decision.as_str(),
            "policies": verdict.policies,
            "reasons": verdict.reasons,
        })).collect::<Vec<_>>(),
    });
    output::emit(json, &value, || table(&rows, failed));
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

type Row = (String, bool, Decision, Option<Vec<String>>, Verdict);

fn table(rows: &[Row], failed: usize) -> String {
    let mut lines = Vec::new();
    for (name, pass, expected, ids, verdict) in rows {
        let got = match verdict.policies.as_slice() {
            [] => verdict.decision.as_str().to_string(),
            p => format!("{} by {}", verdict.decision.as_str(), p.join(", ")),
        };
        if *pass {
            lines.push(format!("PASS  {name}: {got}"));
        } else {
            let want = match ids {
                Some(ids) => format!("{} by {}", expected.as_str(), ids.join(", ")),
                None => expected.as_str().to_string(),
            };
            lines.push(format!("FAIL  {name}: expected {want}, got {got}"));
            for reason in &verdict.reasons {
                lines.push(format!("      reason: {reason}"));
            }
        }
    }
    lines.push(format!("{} passed, {} failed", rows.len() - failed, failed));
    lines.join("\n")
}
