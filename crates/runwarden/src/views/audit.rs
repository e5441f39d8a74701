//! Audit rows as `audit list` prints them, `GET /v1/audit` answers and the console shows
//! them.

use runwarden_vault::audit::action;
use runwarden_vault::{AuditRow, Vault};
use serde::Serialize;
use serde_json::Value;

use crate::output;

/// What `audit list` says about an intent row no completion row names.
pub(crate) const NO_OUTCOME: &str = "no outcome recorded: the process stopped or is still waiting";

/// One audit row as printed: the event's columns plus id and hash.
#[derive(Serialize)]
pub(crate) struct RowView<'a> {
    id: i64,
    time: String,
    #[serde(flatten)]
    event: &'a runwarden_vault::AuditEvent,
    hash: String,
    /// For an intent row only: true when no completion row names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    incomplete: Option<bool>,
    /// For an incomplete intent row: [`NO_OUTCOME`].
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'static str>,
}

impl<'a> RowView<'a> {
    pub(crate) fn new(row: &'a AuditRow) -> Self {
        Self {
            id: row.id,
            time: output::time(row.event.time_ms),
            event: &row.event,
            hash: hex::encode(row.hash),
            incomplete: None,
            outcome: None,
        }
    }

    /// Views of `rows`, with every intent row marked complete or not.
    pub(crate) async fn all(vault: &Vault, rows: &'a [AuditRow]) -> anyhow::Result<Vec<Self>> {
        let intents: Vec<i64> = rows
            .iter()
            .filter(|r| action::is_intent(&r.event.action))
            .map(|r| r.id)
            .collect();
        let incomplete = vault.audit_incomplete(intents).await?;
        Ok(rows
            .iter()
            .map(|row| {
                let mut view = Self::new(row);
                if action::is_intent(&row.event.action) {
                    let open = incomplete.binary_search(&row.id).is_ok();
                    view.incomplete = Some(open);
                    view.outcome = open.then_some(NO_OUTCOME);
                }
                view
            })
            .collect())
    }

    /// One line for people.
    pub(crate) fn line(&self) -> String {
        row_line(&serde_json::to_value(self).unwrap_or(Value::Null))
    }
}

/// One row for people, from its JSON (so a row from the store and one from the API print
/// the same).
pub(crate) fn row_line(row: &Value) -> String {
    let text = |name: &str| row[name].as_str().unwrap_or_default().to_string();
    let action = text("action");
    let mut line = format!(
        "#{} {} {action} {} {} {}{} status={} {}ms",
        row["id"],
        text("time"),
        if crate::views::is_intent(row) {
            "intent"
        } else if row["success"] == true {
            "ok"
        } else {
            "FAILED"
        },
        text("method"),
        text("host"),
        text("path"),
        row["status"],
        row["duration_ms"]
    );
    if let Some(secret) = row["secret"].as_str() {
        line.push_str(&format!(" secret={secret}"));
    }
    if let Some(run) = row["correlation"].as_str() {
        line.push_str(&format!(" run={run}"));
    }
    if let Some(intent) = row["intent_id"].as_i64() {
        line.push_str(&format!(" intent=#{intent}"));
    }
    if let Some(error) = row["error"].as_str() {
        line.push_str(&format!(" error=\"{error}\""));
    }
    if let Some(outcome) = row["outcome"].as_str() {
        line.push_str(&format!(" INCOMPLETE: {outcome}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::row_line;

    #[test]
    fn an_intent_of_the_sandbox_proxy_prints_as_an_intent_not_a_failure() {
        for action in ["proxy_connect_started", "proxy_request_started"] {
            let row = json!({
                "id": 7, "time": "2026-12-05 04:00:00", "action": action, "success": false,
                "method": "CONNECT", "host": "example.com:443", "path": "", "status": 0,
                "duration_ms": 0, "incomplete": true,
                "outcome": super::NO_OUTCOME,
            });
            let line = row_line(&row);
            assert!(
                line.contains(&format!("{action} intent CONNECT example.com:443")),
                "{line}"
            );
            assert!(
                line.ends_with(
                    "INCOMPLETE: no outcome recorded: the process stopped or is still waiting"
                ),
                "{line}"
            );
        }
    }
}
