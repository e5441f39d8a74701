//! The console's pages: runs (filters, paging, live rows), one run (live timeline,
//! Cancel), decisions (the pending queue with its answers), audit (filters, verify), MCP
//! servers (health, tools, effects, approval policy, schemas) and the cancel-latency chart.
//! They read what the API reads, through the same stores and view functions.

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use runwarden_runtime::{DecisionFilter, DecisionStatus, RunFilter, RunState, usage_of};
use runwarden_vault::store::AuditFilter;
use serde_json::Value;

use super::render::{self, Form, event_item, json_text, layout, run_head, run_rows};
use super::session::{Signed, signed_in};
use super::{AppState, PageError};
use crate::decisions::decision_json;
use crate::views::audit::RowView;
use crate::views::mcp::server_views;
use crate::{output, views};

/// Runs on one page of the runs table.
pub(crate) const PAGE_SIZE: u32 = 50;

fn page(title: &str, signed: &Signed, name: &str, body: Markup) -> Response {
    Html(layout(title, Some(signed), name, body).into_string()).into_response()
}

fn query(raw: Option<String>) -> Form {
    Form::parse(raw.unwrap_or_default().as_bytes())
}

/// `/`: the sign-in form, or the runs page for a signed-in browser.
pub(super) async fn home(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    if signed_in(&state, &headers).await?.is_some() {
        return Ok(Redirect::to("/runs").into_response());
    }
    Ok(Html(render::sign_in(None).into_string()).into_response())
}

/// The runs filter of a query string: status and agent (both optional), checked.
pub(crate) fn run_filter(form: &Form) -> Result<RunFilter, PageError> {
    let status = match form.text("status") {
        None => None,
        Some(text) => Some(RunState::parse(&text).ok_or_else(|| {
            PageError::BadRequest(format!(
                "unknown status {text:?}: use queued, running, waiting_for_approval, completed, failed or cancelled"
            ))
        })?),
    };
    Ok(RunFilter {
        status,
        agent: form.text("agent"),
        before_id: form.text("cursor"),
        limit: PAGE_SIZE + 1,
    })
}

const STATUSES: [&str; 6] = [
    "queued",
    "running",
    "waiting_for_approval",
    "completed",
    "failed",
    "cancelled",
];

/// `/runs`: the runs, newest first, filtered by status and agent, a page at a time; the
/// first page's rows are replaced live from `/console/stream/runs`.
pub(super) async fn runs(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let form = query(raw);
    let filter = run_filter(&form)?;
    let first_page = filter.before_id.is_none();
    let (status, agent) = (form.text("status"), form.text("agent"));
    let mut runs = state.runs.run_list(filter).await?;
    let more = runs.len() > PAGE_SIZE as usize;
    runs.truncate(PAGE_SIZE as usize);
    let mut stream = url::form_urlencoded::Serializer::new(String::new());
    let mut next = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in [("status", &status), ("agent", &agent)] {
        if let Some(value) = value {
            stream.append_pair(name, value);
            next.append_pair(name, value);
        }
    }
    let stream = format!("/console/stream/runs?{}", stream.finish());
    let next = runs
        .last()
        .filter(|_| more)
        .map(|last| format!("/runs?{}", next.append_pair("cursor", &last.id).finish()));
    let body = html! {
        h1 { "Runs" }
        form.filters method="get" action="/runs" {
            label { "Status "
                select name="status" {
                    option value="" { "any" }
                    @for s in STATUSES {
                        option value=(s) selected[status.as_deref() == Some(s)] { (s) }
                    }
                }
            }
            label { "Agent "
                select name="agent" {
                    option value="" { "any" }
                    @for name in state.config.agents.keys() {
                        option value=(name) selected[agent.as_deref() == Some(name.as_str())] { (name) }
                    }
                }
            }
            button type="submit" { "Filter" }
        }
        @if first_page {
            p.live #live-note { "Live: rows update as runs change." }
        }
        table.runs {
            thead { tr { th { "Run" } th { "Agent" } th { "Status" } th { "Reason" } th { "Created" } th { "Updated" } } }
            @if first_page {
                tbody #runs-rows data-stream=(stream) data-mode="replace" { (run_rows(&runs)) }
            } @else {
                tbody #runs-rows { (run_rows(&runs)) }
            }
        }
        nav.paging {
            @if !first_page { a href="/runs" { "Newest" } }
            @if let Some(next) = next { a #older href=(next) { "Older runs" } }
        }
    };
    Ok(page("Runs", &signed, "runs", body))
}

/// `/runs/{id}`: one run's head and timeline; the timeline grows live from
/// `/console/stream/runs/{id}`.
pub(super) async fn run(
    State(state): State<AppState>,
    signed: Signed,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let Some(run) = state.runs.run_get(&id).await? else {
        return Err(PageError::NotFound(format!(
            "no run {id}: it may have been typed wrong; the runs page lists every run"
        )));
    };
    let events = state.runs.run_events(&id, 0, 0).await?;
    let usage = usage_of(&events);
    let after = events.last().map_or(0, |e| e.seq);
    let stream = format!("/console/stream/runs/{}?after={after}", run.id);
    let decisions = state
        .runs
        .decision_list(DecisionFilter {
            status: Some(DecisionStatus::Pending),
            run_id: Some(run.id.clone()),
            due_by_ms: None,
            limit: 10,
        })
        .await?;
    let body = html! {
        section #run-head { (run_head(&run, (usage.input_tokens, usage.output_tokens), &signed)) }
        @if !decisions.is_empty() {
            p.notice { "This run waits for " (decisions.len()) " decision(s): " a href="/decisions" { "answer on the decisions page" } }
        }
        h2 { "Timeline" }
        ol #timeline data-stream=(stream) data-mode="append" data-head="run-head" {
            @for event in &events { (event_item(event)) }
        }
    };
    Ok(page(&format!("Run {id}"), &signed, "run", body))
}

/// The pending decisions, newest first.
pub(crate) async fn pending_decisions(
    state: &AppState,
) -> Result<Vec<runwarden_runtime::Decision>, runwarden_base::StoreError> {
    state
        .runs
        .decision_list(DecisionFilter {
            status: Some(DecisionStatus::Pending),
            run_id: None,
            due_by_ms: None,
            limit: 100,
        })
        .await
}

/// The pending queue (what its live stream replaces).
pub(crate) fn pending_list(pending: &[runwarden_runtime::Decision], signed: &Signed) -> Markup {
    html! {
        @if pending.is_empty() { p.empty #no-pending { "Nothing waits for an answer." } }
        @for d in pending { (decision_card(&decision_json(d), signed)) }
    }
}

/// `/decisions`: the pending queue with each call's arguments and the answers its kind
/// allows (for an operator), kept live; then the latest answered.
pub(super) async fn decisions(
    State(state): State<AppState>,
    signed: Signed,
) -> Result<Response, PageError> {
    let pending = pending_decisions(&state).await?;
    let answered = state
        .runs
        .decision_list(DecisionFilter {
            status: Some(DecisionStatus::Answered),
            run_id: None,
            due_by_ms: None,
            limit: 20,
        })
        .await?;
    let body = html! {
        h1 { "Decisions" }
        h2 { "Pending" }
        div #pending data-stream="/console/stream/decisions" data-mode="replace" {
            (pending_list(&pending, &signed))
        }
        h2 { "Recently answered" }
        @if answered.is_empty() { p.empty { "None yet." } }
        @for d in &answered { (decision_card(&decision_json(d), &signed)) }
    };
    Ok(page("Decisions", &signed, "decisions", body))
}

/// One decision: what was asked, its arguments, and for a pending one, the answer forms
/// an operator may send (the answers its kind allows).
fn decision_card(d: &Value, signed: &Signed) -> Markup {
    let field = |name: &str| d[name].as_str().unwrap_or_default().to_string();
    let id = field("decision_id");
    let kind = field("kind");
    let pending = field("status") == "pending";
    let answers: Vec<String> = d["answers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    let action = format!("/console/decisions/{id}");
    html! {
        article.decision data-decision=(id) data-kind=(kind) {
            h3 { (kind) " · " code { (field("tool")) } " · " span class={ "status status-" (field("status")) } { (field("status")) } }
            p { "Run " a href={ "/runs/" (field("run_id")) } { code { (field("run_id")) } } " · asked " (field("asked"))
                @if let Some(expires) = d["expires"].as_str() { " · expires " (expires) } }
            @if let Some(message) = d["message"].as_str() { p.message { (message) } }
            pre.arguments { (json_text(&d["arguments"])) }
            @if let Some(answer) = d["answer"].as_str() {
                p.answered { "Answered " strong { (answer) } " by " (field("actor")) " at " (field("answered"))
                    @if let Some(reason) = d["reason"].as_str() { ": " (reason) } }
            }
            @if pending && signed.is_operator() {
                div.answers {
                    @for answer in &answers {
                        @if answer == "deny" {
                            form.answer method="post" action=(action) {
                                input type="hidden" name="csrf" value=(signed.csrf);
                                input type="hidden" name="answer" value="deny";
                                input type="text" name="reason" placeholder="why (required)" required;
                                button.danger type="submit" { "Deny" }
                            }
                        } @else if answer == "accept" {
                            form.answer method="post" action=(action) {
                                input type="hidden" name="csrf" value=(signed.csrf);
                                input type="hidden" name="answer" value="accept";
                                textarea name="content" rows="3" placeholder="content, a JSON object" {}
                                button type="submit" { "Accept" }
                            }
                        } @else {
                            form.answer method="post" action=(action) {
                                input type="hidden" name="csrf" value=(signed.csrf);
                                input type="hidden" name="answer" value=(answer);
                                button class={ "answer-" (answer) } type="submit" { (label(answer)) }
                            }
                        }
                    }
                    @if kind == "approval" {
                        form.answer.edit method="post" action=(action) {
                            input type="hidden" name="csrf" value=(signed.csrf);
                            input type="hidden" name="answer" value="approve";
                            textarea name="arguments" rows="4" { (json_text(&d["arguments"])) }
                            button type="submit" { "Edit and approve" }
                        }
                    }
                }
            }
        }
    }
}

fn label(answer: &str) -> &'static str {
    match answer {
        "approve" => "Approve",
        "applied" => "It took effect",
        "not_applied" => "It did not take effect",
        "decline" => "Decline",
        "cancel" => "Cancel the run",
        _ => "Answer",
    }
}

/// `/audit`: the newest rows, filtered by action and run; `?verify=1` also checks the
/// chain and shows the report.
pub(super) async fn audit(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let form = query(raw);
    let (action, run) = (form.text("action"), form.text("run"));
    let rows = state
        .vault
        .audit_list(AuditFilter {
            action: action.clone(),
            correlation: run.clone(),
            newest_first: true,
            limit: 100,
            after_id: None,
        })
        .await?;
    let views = RowView::all(&state.vault, &rows).await?;
    let views: Vec<Value> = views
        .iter()
        .map(|v| serde_json::to_value(v).unwrap_or_default())
        .collect();
    let report = if form.get("verify").is_some() {
        Some(state.vault.audit_verify().await?)
    } else {
        None
    };
    let body = html! {
        h1 { "Audit log" }
        form.filters method="get" action="/audit" {
            label { "Action " input type="text" name="action" value=(action.as_deref().unwrap_or("")); }
            label { "Run " input type="text" name="run" value=(run.as_deref().unwrap_or("")); }
            button type="submit" { "Filter" }
            button type="submit" name="verify" value="1" { "Verify the chain" }
        }
        @if let Some(report) = &report {
            section #verify class={ "verify " (if report.intact { "intact" } else { "broken" }) } {
                h2 { @if report.intact { "The chain is intact" } @else { "The chain is broken" } }
                p { (output::count(report.rows_verified.max(0) as u64, "row", "rows")) " verified · " (output::count(report.incomplete_calls, "call", "calls")) " without an outcome"
                    @if let Some(row) = report.first_bad_row { " · first bad row " (row) }
                    @if let Some(anchored) = report.anchored_rows { " · anchored rows " (anchored) } }
                @if let Some(problem) = &report.problem { p.error-text { (problem) } }
            }
        }
        table.audit {
            thead { tr { th { "#" } th { "Time" } th { "Action" } th { "Actor" } th { "Call" } th { "Status" } th { "Run" } th { "Reason / error" } } }
            tbody {
                @for v in &views {
                    tr {
                        td { (v["id"]) }
                        td { (v["time"].as_str().unwrap_or("")) }
                        td { (v["action"].as_str().unwrap_or("")) }
                        td { (v["actor"].as_str().unwrap_or("")) }
                        td { (v["method"].as_str().unwrap_or("")) " " (v["host"].as_str().unwrap_or("")) (v["path"].as_str().unwrap_or("")) }
                        td { @if views::is_intent(v) { "intent" } @else { (v["status"]) @if v["success"] == Value::Bool(false) { " failed" } } }
                        td { (v["correlation"].as_str().unwrap_or("")) }
                        td.reason { (v["reason"].as_str().unwrap_or("")) " " (v["error"].as_str().unwrap_or("")) (v["outcome"].as_str().unwrap_or("")) }
                    }
                }
            }
        }
    };
    Ok(page("Audit", &signed, "audit", body))
}

/// `/mcp`: each configured server's health and its tools with the effect the
/// configuration gives them, their approval policy and schema status.
pub(super) async fn mcp(
    State(state): State<AppState>,
    signed: Signed,
) -> Result<Response, PageError> {
    let catalogue = state.catalogue.catalogue_list(None).await?;
    let health = state.catalogue.health_list().await?;
    let views = server_views(&state.config, None, &catalogue, &health);
    let views: Vec<Value> = views
        .iter()
        .map(|v| serde_json::to_value(v).unwrap_or_default())
        .collect();
    let body = html! {
        h1 { "MCP servers" }
        @if views.is_empty() { p.empty { "No MCP servers configured: add [mcp.servers.NAME] with a url (or a command, for a local server) to runwarden.toml." } }
        @for s in &views {
            @let name = s["name"].as_str().unwrap_or_default();
            @let approval = state.config.approvals.get(name);
            article.server data-server=(name) {
                h2 { (name) }
                @if let Some(command) = s["command"].as_str() {
                    p { "Local (stdio) " code { (command) } " · sandbox " (s["sandbox"].as_str().unwrap_or("")) }
                }
                p { code { (s["url"].as_str().unwrap_or("")) } " · default effect " (s["effect"].as_str().unwrap_or("")) " · " (s["timeout_seconds"]) " s budget" }
                p.health {
                    "Last success: " (s["last_success"].as_str().unwrap_or("never"))
                    " · last failure: " (s["last_failure"].as_str().unwrap_or("never"))
                    @if let Some(error) = s["last_error"].as_str() { " · " span.error-text { (error) } }
                }
                p { "Approval: " @if approval.is_some_and(|a| a.required) { "required for every tool" } @else { "not required by default" } }
                table.tools {
                    thead { tr { th { "Tool" } th { "Remote name" } th { "Effect" } th { "Approval" } th { "Schema" } } }
                    tbody {
                        @for t in s["tools"].as_array().into_iter().flatten() {
                            @let remote = t["remote_name"].as_str().unwrap_or_default();
                            @let needs = approval.map(|a| a.tools.get(remote).and_then(|(own, _)| *own).unwrap_or(a.required));
                            tr {
                                td { code { (t["local_name"].as_str().unwrap_or("")) } }
                                td { (remote) }
                                td { (t["effect"].as_str().unwrap_or("")) }
                                td { @if needs == Some(true) { "required" } @else { "no" } }
                                td { @if let Some(why) = t["refused"].as_str() { span.error-text { "refused: " (why) } }
                                     @else { "usable" @if t["checks_output"] == Value::Bool(true) { " · output checked" } } }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page("MCP servers", &signed, "mcp", body))
}

/// `/charts`: the cancel-latency histogram of this process's registry, drawn as an
/// inline SVG on the server (no script needed).
pub(super) async fn charts(
    State(state): State<AppState>,
    signed: Signed,
) -> Result<Response, PageError> {
    let exposition = super::super::metrics::metrics(State(state.clone()))
        .await
        .map_err(|_| PageError::Unavailable)?;
    let bytes = axum::body::to_bytes(exposition.into_body(), 4 << 20)
        .await
        .map_err(|e| PageError::from(anyhow::Error::new(e)))?;
    let text = String::from_utf8_lossy(&bytes);
    let buckets = cancel_buckets(&text);
    let body = html! {
        h1 { "Metrics" }
        h2 { "Cancel latency (this process)" }
        p { "Time from a cancel waking a run here to its call in flight returning; the goal: p99 ≤ 10 ms in-process, ≤ 50 ms through the API." }
        (histogram_svg(&buckets))
        p { a href="/metrics" { "The full exposition" } " (needs a bearer token)." }
    };
    Ok(page("Metrics", &signed, "charts", body))
}

/// The cancel-latency buckets of an OpenMetrics exposition: (upper bound label, count in
/// that bucket alone), from the cumulative `_bucket` series.
pub(crate) fn cancel_buckets(exposition: &str) -> Vec<(String, u64)> {
    let mut cumulative = Vec::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("runwarden_cancel_latency_seconds_bucket{le=\"") else {
            continue;
        };
        let Some((le, value)) = rest.split_once("\"}") else {
            continue;
        };
        let count = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        cumulative.push((le.to_string(), count));
    }
    let mut previous = 0;
    cumulative
        .into_iter()
        .map(|(le, total)| {
            let own = total.saturating_sub(previous);
            previous = total;
            let label = match le.parse::<f64>() {
                Ok(seconds) if seconds.is_finite() => format!("≤{} ms", seconds * 1000.0),
                _ => "more".to_string(),
            };
            (label, own)
        })
        .collect()
}

/// A bar chart of the buckets, as SVG elements with presentation attributes only (the
/// CSP allows no inline style).
fn histogram_svg(buckets: &[(String, u64)]) -> Markup {
    let max = buckets.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
    let total: u64 = buckets.iter().map(|(_, n)| *n).sum();
    let (width, height, bar) = (760u64, 240u64, 64u64);
    html! {
        figure.chart {
            svg #cancel-histogram xmlns="http://www.w3.org/2000/svg" width=(width) height=(height + 40) viewBox={ "0 0 " (width) " " (height + 40) } role="img" aria-label="cancel latency histogram" {
                @for (i, (label, n)) in buckets.iter().enumerate() {
                    @let h = n * (height - 20) / max;
                    @let x = 10 + i as u64 * (bar + 10);
                    rect x=(x) y=(height - h) width=(bar) height=(h) fill="#3b6ea5" {}
                    text x=(x + bar / 2) y=(height - h - 4) text-anchor="middle" font-size="12" { (n) }
                    text x=(x + bar / 2) y=(height + 16) text-anchor="middle" font-size="11" { (label) }
                }
            }
            figcaption { (output::count(total, "cancel", "cancels")) " observed by this process" }
        }
    }
}
