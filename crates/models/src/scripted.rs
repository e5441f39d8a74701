//! The scripted provider (L2): replays a JSON plan of turns, with no network at all.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use runwarden_vault::{CancellationSignal, EgressClient};
use serde_json::{Map, Value};

use crate::error::ModelError;
use crate::provider::{Message, ModelProvider, ModelRequest, ModelTurn, ToolCallRequest};

/// A tool call as the plan names it; its id is made at replay.
#[derive(Debug, Clone, PartialEq)]
struct PlannedCall {
    name: String,
    arguments: Value,
}

/// One turn of the plan.
#[derive(Debug, Clone, PartialEq)]
struct PlannedTurn {
    text: Option<String>,
    tool_calls: Vec<PlannedCall>,
}

/// A provider that answers from a plan, for demos and tests (L2).
///
/// The plan is a JSON list of turns, each `{"tool_calls": [{"name": ..., "arguments":
/// {...}}]}`, `{"text": "..."}` or both:
///
/// ```json
/// [
///   {"tool_calls": [{"name": "tickets__create", "arguments": {"title": "Printer on fire"}}]},
///   {"text": "Ticket created."}
/// ]
/// ```
///
/// Replay is stateless: the turn played is the number of assistant messages already in
/// the request, so a resumed or restarted run gets the turn it is at. Tool call ids are
/// `call-<turn>-<n>`, both counted from 1. No call leaves the process, but the signal is
/// still honoured: a signal already true answers [`ModelError::Cancelled`].
///
/// Given the vault ([`Scripted::guarded_by`]), each turn passes the same check as a real
/// model's: a stored secret is cut out of its text, and a tool call whose arguments carry
/// one is refused (`secret_exfiltration`), so a plan cannot put a secret into the run's
/// events or send it to a server.
#[derive(Debug, Clone)]
pub struct Scripted {
    turns: Vec<PlannedTurn>,
    egress: Option<Arc<EgressClient>>,
}

impl Scripted {
    /// Reads a plan file; an error names the file and what is wrong with it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ModelError::Script(format!("could not read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|what| ModelError::Script(format!("{}: {what}", path.display())))
    }

    /// Reads a plan from its JSON text.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        Self::parse(text).map_err(ModelError::Script)
    }

    /// Checks each turn against the vault's secrets, as a real model's turns are.
    pub fn guarded_by(mut self, egress: Arc<EgressClient>) -> Self {
        self.egress = Some(egress);
        self
    }

    /// How many turns the plan has.
    pub fn turn_count(&self) -> usize {
        self.turns.len()
    }

    fn parse(text: &str) -> Result<Self, String> {
        let plan: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Array(items) = plan else {
            return Err("the plan must be a JSON list of turns".into());
        };
        if items.is_empty() {
            return Err("the plan has no turns".into());
        }
        let turns = items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_turn(i + 1, item))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            turns,
            egress: None,
        })
    }
}

fn parse_turn(number: usize, item: &Value) -> Result<PlannedTurn, String> {
    let Value::Object(fields) = item else {
        return Err(format!("turn {number} is not an object"));
    };
    // Unknown keys are refused so that a typo ("tool_call") fails loudly, not silently.
    if let Some(key) = fields.keys().find(|k| *k != "text" && *k != "tool_calls") {
        return Err(format!(
            "turn {number} has an unknown key {key:?}: a turn has \"text\", \"tool_calls\" or both"
        ));
    }
    let text = match fields.get("text") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()).filter(|s| !s.is_empty()),
        Some(_) => return Err(format!("turn {number}: \"text\" must be a string")),
    };
    let tool_calls = match fields.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(n, call)| parse_call(number, n + 1, call))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(format!("turn {number}: \"tool_calls\" must be a list")),
    };
    if text.is_none() && tool_calls.is_empty() {
        return Err(format!("turn {number} has neither text nor tool calls"));
    }
    Ok(PlannedTurn { text, tool_calls })
}

fn parse_call(turn: usize, n: usize, call: &Value) -> Result<PlannedCall, String> {
    let Value::Object(fields) = call else {
        return Err(format!("turn {turn}, tool call {n} is not an object"));
    };
    if let Some(key) = fields.keys().find(|k| *k != "name" && *k != "arguments") {
        return Err(format!(
            "turn {turn}, tool call {n} has an unknown key {key:?}: a call has \"name\" and \"arguments\""
        ));
    }
    let name = match fields.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => return Err(format!("turn {turn}, tool call {n} has no \"name\"")),
    };
    let arguments = match fields.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(arguments @ Value::Object(_)) => arguments.clone(),
        Some(_) => {
            return Err(format!(
                "turn {turn}, tool call {n} ({name:?}): \"arguments\" must be an object"
            ));
        }
    };
    Ok(PlannedCall { name, arguments })
}

#[async_trait]
impl ModelProvider for Scripted {
    /// A plan has no model: policies name it `Model::"scripted"`.
    fn model_name(&self) -> Option<String> {
        Some("scripted".to_string())
    }

    fn egress(&self) -> Option<Arc<EgressClient>> {
        self.egress.clone()
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<ModelTurn, ModelError> {
        // L1 applies here too: a cancelled run gets no further turn, even a local one.
        if signal.is_some_and(|s| s.is_cancelled()) {
            return Err(ModelError::Cancelled { in_flight: false });
        }
        let index = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count();
        let Some(planned) = self.turns.get(index) else {
            return Err(ModelError::Script(format!(
                "the plan has {} turns; turn {} was asked for",
                self.turns.len(),
                index + 1
            )));
        };
        let turn = index + 1;
        let turn = ModelTurn {
            text: planned.text.clone(),
            tool_calls: planned
                .tool_calls
                .iter()
                .enumerate()
                .map(|(n, call)| ToolCallRequest {
                    id: format!("call-{turn}-{}", n + 1),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    invalid_arguments: None,
                })
                .collect(),
            finish: None,
            usage: None,
        };
        match &self.egress {
            Some(egress) => {
                crate::call::guarded(egress, turn, request.correlation.as_deref()).await
            }
            None => Ok(turn),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> String {
        Scripted::from_json(text).unwrap_err().to_string()
    }

    #[test]
    fn a_plan_names_what_is_wrong_with_it() {
        assert!(refusal("{").contains("not JSON"));
        assert!(refusal(r#"{"text": "x"}"#).contains("a JSON list of turns"));
        assert!(refusal("[]").contains("no turns"));
        assert!(
            refusal(r#"[{"text": "a"}, {"tool_call": []}]"#)
                .contains("turn 2 has an unknown key \"tool_call\"")
        );
        assert!(
            refusal(r#"[{"tool_calls": []}]"#).contains("turn 1 has neither text nor tool calls")
        );
        assert!(
            refusal(r#"[{"tool_calls": [{"arguments": {}}]}]"#)
                .contains("turn 1, tool call 1 has no \"name\"")
        );
        assert!(
            refusal(r#"[{"tool_calls": [{"name": "t", "arguments": "x"}]}]"#)
                .contains("\"arguments\" must be an object")
        );
    }

    #[test]
    fn a_turn_may_carry_both_text_and_calls() {
        let plan =
            Scripted::from_json(r#"[{"text": "on it", "tool_calls": [{"name": "t"}]}]"#).unwrap();
        assert_eq!(plan.turn_count(), 1);
        assert_eq!(plan.turns[0].text.as_deref(), Some("on it"));
        assert_eq!(
            plan.turns[0].tool_calls[0].arguments,
            Value::Object(Map::new())
        );
    }
}
