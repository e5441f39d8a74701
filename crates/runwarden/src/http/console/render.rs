//! The console's HTML, rendered with maud (every interpolated value is escaped): the page
//! layout, the sign-in form, and the fragments the first load and the live streams share
//! (a runs table's rows, a run's head, one timeline entry).

use maud::{DOCTYPE, Markup, html};
use runwarden_runtime::events::is_final_kind;
use runwarden_runtime::{Run, RunEvent};
use serde_json::Value;

use super::assets;
use super::session::Signed;
use crate::output;
use crate::views::event_line;

/// A urlencoded form body, parsed without a content-type check so a forged request with
/// none is refused for its missing CSRF token, not for its encoding.
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    pub(crate) fn parse(body: &[u8]) -> Self {
        Self(url::form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of `name`, if present.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name` when present and not blank.
    pub(crate) fn text(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    }
}

/// A page: head with the one stylesheet and the one script, the navigation for a
/// signed-in user, and `body`.
pub(crate) fn layout(title: &str, signed: Option<&Signed>, page: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · runwarden" }
                link rel="stylesheet" href=(assets::css_path());
                script src=(assets::js_path()) defer {}
            }
            body data-page=(page) {
                header.top {
                    a.brand href="/runs" { "runwarden" }
                    @if let Some(signed) = signed {
                        nav {
                            a href="/runs" { "Runs" }
                            a href="/decisions" { "Decisions" }
                            a href="/audit" { "Audit" }
                            a href="/mcp" { "MCP servers" }
                            a href="/charts" { "Metrics" }
                        }
                        span.who { (signed.token.name) " · " (signed.token.role.as_str()) }
                        form.signout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(signed.csrf);
                            button.link type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The sign-in page, with an error when the last attempt failed.
pub(crate) fn sign_in(error: Option<&str>) -> Markup {
    let body = html! {
        section.signin {
            h1 { "Sign in" }
            p { "Paste an API token (" code { (crate::hints::TOKEN_HINT) } ", or " code { "--role viewer" } " to only look" "). The console keeps a session cookie; the token itself is not stored in the browser." }
            @if let Some(error) = error {
                p.error-text role="alert" { (error) }
            }
            form method="post" action="/console/login" {
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="off" required;
                button type="submit" { "Sign in" }
            }
        }
    };
    layout("Sign in", None, "signin", body)
}

/// One row of the runs table.
pub(crate) fn run_row(run: &Run) -> Markup {
    html! {
        tr data-run=(run.id) {
            td { a href={ "/runs/" (run.id) } { code { (run.id) } } }
            td { (run.agent) }
            td { span class={ "status status-" (run.status.as_str()) } { (run.status.as_str()) } }
            td.reason { (run.termination_reason.as_deref().unwrap_or("")) }
            td { (output::time(run.created_ms)) }
            td { (output::time(run.updated_ms)) }
        }
    }
}

/// The rows of the runs table (what its live stream replaces).
pub(crate) fn run_rows(runs: &[Run]) -> Markup {
    html! {
        @if runs.is_empty() {
            tr.empty { td colspan="6" { "No runs match." } }
        }
        @for run in runs { (run_row(run)) }
    }
}

/// A run's head: status, reason in full, the fence, usage, and the Cancel button for an
/// operator while the run can still be cancelled.
pub(crate) fn run_head(run: &Run, usage: (u64, u64), signed: &Signed) -> Markup {
    html! {
        h1 { "Run " code { (run.id) } }
        dl.facts {
            dt { "Status" } dd { span #run-status class={ "status status-" (run.status.as_str()) } { (run.status.as_str()) } }
            dt { "Agent" } dd { (run.agent) }
            @if let Some(who) = &run.origin.started_by {
                dt { "Started by" } dd #run-started-by { (who) }
            }
            @if !run.origin.tags.is_empty() {
                dt { "Tags" } dd #run-tags { @for tag in &run.origin.tags { code.tag { (tag) } " " } }
            }
            @if let Some(reason) = &run.termination_reason {
                dt { "Reason" } dd.reason #run-reason { (reason) }
            }
            @if let Some(effect) = &run.pending_effect {
                // A write whose outcome is not recorded keeps its fence: a guard while the
                // run goes on, a question for a person (red) once the run has ended.
                @if run.status.is_terminal() {
                    dt { "Fence" } dd.fence.needs-person #run-fence { (effect) ": it may or may not have happened; check before running it again" }
                } @else {
                    dt { "Fence" } dd.fence #run-fence { (effect) " in flight: never sent twice" }
                }
            }
            dt { "Rounds" } dd { (run.rounds) }
            dt { "Attempts" } dd { (run.requeue_count + 1) }
            dt { "Tokens" } dd { (usage.0) " in · " (usage.1) " out" }
            dt { "Updated" } dd { (output::time(run.updated_ms)) }
        }
        @if signed.is_operator() && !run.status.is_terminal() {
            form.cancel method="post" action={ "/console/runs/" (run.id) "/cancel" } {
                input type="hidden" name="csrf" value=(signed.csrf);
                button.danger #cancel type="submit" { "Cancel run" }
            }
        }
    }
}

/// One entry of a run's timeline: its one-line summary and its payload in full.
pub(crate) fn event_item(event: &RunEvent) -> Markup {
    let pretty = serde_json::to_string_pretty(&event.payload).unwrap_or_default();
    let class = if is_final_kind(&event.kind) {
        "event final"
    } else if event.kind == "effect_uncertain" {
        "event uncertain"
    } else {
        "event"
    };
    html! {
        li class=(class) data-seq=(event.seq) data-kind=(event.kind) {
            div.line {
                span.seq { "#" (event.seq) }
                span.kind { (event.kind) }
                span.time { (output::time(event.time_ms)) }
                @if let Some(decided) = policy_of(event) {
                    span.policy title="the policies that decided this call" { (decided) }
                }
            }
            p.summary { (event_line(event)) }
            details open[is_final_kind(&event.kind) || event.kind == "effect_uncertain"] {
                summary { "payload" }
                pre.payload { (pretty) }
            }
        }
    }
}

/// Which policies decided a tool call (`allow by peer-tools`), when policies did; the
/// default deny reads `deny: no policy permits this`.
fn policy_of(event: &RunEvent) -> Option<String> {
    let note = event.payload.get("policy")?;
    let decision = note.get("decision")?.as_str()?;
    let ids: Vec<&str> = note
        .get("policies")?
        .as_array()?
        .iter()
        .filter_map(|id| id.as_str())
        .collect();
    Some(if ids.is_empty() {
        format!("policy {decision}: {}", runwarden_policy::NO_PERMIT)
    } else {
        format!("policy {decision} by {}", ids.join(", "))
    })
}

/// JSON shown as indented text.
pub(crate) fn json_text(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn step(payload: Value) -> RunEvent {
        RunEvent {
            run_id: "r".into(),
            seq: 3,
            kind: "tool_executed".into(),
            payload,
            time_ms: 0,
        }
    }

    #[test]
    fn a_tool_step_shows_the_policies_that_decided_it() {
        let allowed = step(json!({
            "round": 1, "call_id": "c", "tool": "peer__pay", "outcome": "succeeded", "text": "ok",
            "policy": {"decision": "allow", "policies": ["peer-tools", "small-payments"], "reasons": []}
        }));
        let page = event_item(&allowed).into_string();
        assert!(
            page.contains("policy allow by peer-tools, small-payments"),
            "{page}"
        );
        let denied = step(json!({
            "round": 1, "call_id": "c", "tool": "peer__pay", "outcome": "denied",
            "text": "denied: no policy permits this",
            "policy": {"decision": "deny", "policies": [], "reasons": ["no policy permits this"]}
        }));
        let page = event_item(&denied).into_string();
        assert!(
            page.contains("policy deny: no policy permits this"),
            "{page}"
        );
        let unpoliced = step(json!({
            "round": 1, "call_id": "c", "tool": "peer__pay", "outcome": "succeeded", "text": "ok"
        }));
        assert!(
            !event_item(&unpoliced)
                .into_string()
                .contains("span class=\"policy\"")
        );
    }
}
