//! Operator decisions (R12): one pending question about one tool call of one run, its
//! kinds and answers, and what the store is asked when one is asked or answered.
//!
//! A run that waits on a decision of kind `approval` or `effect_uncertain` is parked: its
//! status is `waiting_for_approval`, it holds no lease and no worker slot. Answering is one
//! transaction that records the answer (only if none was given, the decision has not
//! expired and the run still waits), appends `decision_answered` to the run's log and
//! moves the run back to `queued`, so any worker on any node resumes it. An `input`
//! decision belongs to a call in flight: the run keeps its lease and the answer goes back
//! to the MCP server through the [`Elicitor`](runwarden_mcp::Elicitor).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// How long an approval waits by default before it is denied as expired (R12).
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The reason recorded for an approval that nobody answered in time.
pub const EXPIRED_REASON: &str = "expired";

/// The actor recorded for an answer the runtime gave itself (an expiry).
pub const SYSTEM_ACTOR: &str = "runwarden";

/// What a decision is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// A tool whose policy requires an operator's approval before it is called.
    Approval,
    /// A non-idempotent write whose call may have reached the server and got no answer
    /// (R11): a person says whether it took effect.
    EffectUncertain,
    /// An MCP server asked for input: during a call (`elicitation/create`, M14), or as
    /// the call's result (`input_required`, M19; the run then parks).
    Input,
}

impl DecisionKind {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approval => "approval",
            Self::EffectUncertain => "effect_uncertain",
            Self::Input => "input",
        }
    }

    /// Parses a stored kind.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Approval, Self::EffectUncertain, Self::Input]
            .into_iter()
            .find(|k| k.as_str() == text)
    }

    /// True for the kinds that park the run (no lease, no slot) until answered; an
    /// `input` decision parks when it carries a re-issue ([`Decision::parks_the_run`]).
    pub fn parks_the_run(self) -> bool {
        !matches!(self, Self::Input)
    }

    /// The answers an operator may give to this kind.
    pub fn answers(self) -> &'static [Answer] {
        match self {
            Self::Approval => &[Answer::Approve, Answer::Deny, Answer::Cancel],
            Self::EffectUncertain => &[Answer::Applied, Answer::NotApplied, Answer::Cancel],
            Self::Input => &[Answer::Accept, Answer::Decline, Answer::Cancel],
        }
    }
}

/// Where a decision stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionStatus {
    /// Asked, not answered yet.
    Pending,
    /// Answered by an operator.
    Answered,
    /// Nobody answered in time: an approval is denied with the reason "expired", an input
    /// is declined.
    Expired,
    /// The run was cancelled (or ended) while the decision waited: the cancel won (R4).
    Dropped,
}

impl DecisionStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Answered => "answered",
            Self::Expired => "expired",
            Self::Dropped => "dropped",
        }
    }

    /// Parses a stored status.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Pending, Self::Answered, Self::Expired, Self::Dropped]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// An answer to a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Approval: make the call (with the operator's arguments when given).
    Approve,
    /// Approval: do not make it; the model reads "denied by an operator: REASON".
    Deny,
    /// Effect uncertain: the action took effect (its result is unknown).
    Applied,
    /// Effect uncertain: the action did not take effect; the model may decide again.
    NotApplied,
    /// Input: the operator's content goes back to the server.
    Accept,
    /// Input: the operator declines.
    Decline,
    /// Approval and effect uncertain: cancel the run. Input: the elicitation's cancel.
    Cancel,
    /// Nobody answered in time (written by the runtime, never by an operator).
    Expired,
}

impl Answer {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Deny => "deny",
            Self::Applied => "applied",
            Self::NotApplied => "not_applied",
            Self::Accept => "accept",
            Self::Decline => "decline",
            Self::Cancel => "cancel",
            Self::Expired => "expired",
        }
    }

    /// Parses an answer's text.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::Approve,
            Self::Deny,
            Self::Applied,
            Self::NotApplied,
            Self::Accept,
            Self::Decline,
            Self::Cancel,
            Self::Expired,
        ]
        .into_iter()
        .find(|a| a.as_str() == text)
    }
}

/// One decision as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// A UUIDv7.
    pub id: String,
    /// The run that waits.
    pub run_id: String,
    /// What it is about.
    pub kind: DecisionKind,
    /// The model round whose tool call it concerns.
    pub round: u32,
    /// The model's id for the tool call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The arguments exactly as the model produced them (shown to the operator).
    pub arguments: Value,
    /// The SHA-256 of their canonical JSON (R12: the decision is bound to them).
    pub arguments_hash: String,
    /// For people: the server's question (input) or what went wrong (effect uncertain).
    pub message: Option<String>,
    /// Input: the flat object schema the answer's content must match.
    pub requested_schema: Option<Value>,
    /// When it was asked, Unix milliseconds UTC.
    pub asked_ms: i64,
    /// When it expires, Unix milliseconds UTC.
    pub expires_ms: i64,
    /// Where it stands.
    pub status: DecisionStatus,
    /// The answer, once given.
    pub answer: Option<Answer>,
    /// The reason given with it (a denial's reason, "expired").
    pub reason: Option<String>,
    /// Approval: the arguments the operator edited, when they did.
    pub answer_arguments: Option<Value>,
    /// Input: the content accepted.
    pub content: Option<Value>,
    /// Who answered: the API token's name, `cli`, or `runwarden` for an expiry.
    pub actor: Option<String>,
    /// When it was answered.
    pub answered_ms: Option<i64>,
    /// M19: the call ended with the server's `input_required`; how to re-issue it once
    /// answered (the run is parked meanwhile). `None` for an elicitation during a call.
    pub reissue: Option<Reissue>,
    /// G1: the asker waits within its call (a gateway client): the run stays running and
    /// keeps its lease, and the answer goes to the waiting call, never to a resumed run.
    pub in_call: bool,
}

/// M19: what a parked `input` decision keeps so that any worker, on any node, days later,
/// can re-issue the call with the answer: the question's key and the server's
/// `requestState`, exactly as sent (opaque: never inspected, never shown).
#[derive(Clone, PartialEq, Eq)]
pub struct Reissue {
    /// The key of the question in `inputRequests` (the answer goes back under it).
    pub input_key: String,
    /// The server's `requestState`; `None` when it sent none (and then none is sent back).
    pub request_state: Option<String>,
}

impl std::fmt::Debug for Reissue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The state is the server's own and may hold anything: its size only.
        f.debug_struct("Reissue")
            .field("input_key", &self.input_key)
            .field(
                "request_state",
                &self
                    .request_state
                    .as_ref()
                    .map(|s| format!("[{} bytes]", s.len())),
            )
            .finish()
    }
}

impl Decision {
    /// True when the run waits parked (no lease, no slot) until this is answered: an
    /// approval, an uncertain effect, or an input asked by an `input_required` result.
    pub fn parks_the_run(&self) -> bool {
        !self.in_call && (self.kind.parks_the_run() || self.reissue.is_some())
    }

    /// M19: the answer as the server reads it in `inputResponses` (an elicitation's
    /// result): accept with the content, cancel, else decline (a decline, an expiry).
    pub fn elicitation_result(&self) -> Value {
        match (self.answer, &self.content) {
            (Some(Answer::Accept), Some(content)) => {
                serde_json::json!({"action": "accept", "content": content})
            }
            (Some(Answer::Cancel), _) => serde_json::json!({"action": "cancel"}),
            _ => serde_json::json!({"action": "decline"}),
        }
    }
}

/// Parameters of [`RunStore::decision_ask`](crate::store::RunStore::decision_ask).
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionAsk {
    /// The decision, pending.
    pub decision: Decision,
    /// The segment that must hold the running run's lease.
    pub owner: String,
    /// The claim epoch the segment holds (its run's `claim_epoch` when claimed).
    pub epoch: i64,
    /// The `decision_asked` event's payload, appended in the same transaction.
    pub event_payload: Value,
}

/// Parameters of [`RunStore::decision_answer`](crate::store::RunStore::decision_answer).
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionAnswer {
    /// The decision.
    pub id: String,
    /// The answer, already checked against the decision's kind.
    pub answer: Answer,
    /// A reason (required for a denial).
    pub reason: Option<String>,
    /// Approval: edited arguments, already checked against the tool's schema.
    pub arguments: Option<Value>,
    /// Input: accepted content, already checked against the requested schema.
    pub content: Option<Value>,
    /// Who answers.
    pub actor: String,
    /// Now. An operator's answer is refused at or after the expiry; an expiry
    /// ([`Answer::Expired`]) is refused before it.
    pub now_ms: i64,
}

/// What an answer did.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerOutcome {
    /// This answer won: the decision as it now stands.
    Answered(Decision),
    /// No decision has that id.
    NotFound,
    /// Refused: the decision is no longer pending (answered, expired, dropped), or has
    /// expired, or its run no longer waits (cancelled, finished). The decision as read.
    Refused(Decision, AnswerRefusal),
}

/// Why an answer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerRefusal {
    /// Someone answered first.
    AlreadyAnswered,
    /// The decision expired.
    Expired,
    /// The run was cancelled while it waited: the cancel won.
    RunCancelled,
    /// The run is finished or no longer waits for this decision.
    RunNotWaiting,
    /// An expiry came before the decision's time.
    NotDue,
}

/// Which decisions [`RunStore::decision_list`](crate::store::RunStore::decision_list)
/// returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionFilter {
    /// Only decisions in this status.
    pub status: Option<DecisionStatus>,
    /// Only decisions of this run.
    pub run_id: Option<String>,
    /// Only pending decisions whose expiry is at or before this time (the expiry sweep).
    pub due_by_ms: Option<i64>,
    /// At most this many (0 means 50), newest first.
    pub limit: u32,
}

/// The arguments' canonical hash (R12): SHA-256 over their JSON with object keys sorted,
/// as lowercase hex, so the same arguments always hash the same whatever their key order.
pub fn arguments_hash(arguments: &Value) -> String {
    fn canonical(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*key).clone()).to_string());
                    out.push(':');
                    canonical(&map[*key], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut text = String::new();
    canonical(arguments, &mut text);
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// A refused answer, in words that say what happened and what is left to do.
pub fn refusal_message(decision: &Decision, refusal: AnswerRefusal) -> String {
    let id = &decision.id;
    match refusal {
        AnswerRefusal::AlreadyAnswered => format!(
            "decision {id} was already answered ({} by {}): an answer is given once",
            decision.answer.map_or("?", Answer::as_str),
            decision.actor.as_deref().unwrap_or("?")
        ),
        AnswerRefusal::Expired => format!(
            "decision {id} expired: the call was denied as \"expired\"; start a new run if it is still wanted"
        ),
        AnswerRefusal::RunCancelled => format!(
            "run {} was cancelled, so decision {id} is void: a cancelled run takes no answer",
            decision.run_id
        ),
        AnswerRefusal::RunNotWaiting => format!(
            "run {} no longer waits for decision {id} (it finished or moved on)",
            decision.run_id
        ),
        AnswerRefusal::NotDue => format!("decision {id} is not due to expire yet"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_arguments_hash_ignores_key_order_and_sees_every_value() {
        let a = arguments_hash(&json!({"title": "printer", "n": [1, {"b": 2, "a": 1}]}));
        let b = arguments_hash(&json!({"n": [1, {"a": 1, "b": 2}], "title": "printer"}));
        assert_eq!(a, b);
        assert_ne!(a, arguments_hash(&json!({"title": "printer", "n": [1]})));
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn each_kind_takes_only_its_own_answers() {
        assert!(DecisionKind::Approval.answers().contains(&Answer::Approve));
        assert!(!DecisionKind::Approval.answers().contains(&Answer::Applied));
        assert!(
            !DecisionKind::EffectUncertain
                .answers()
                .contains(&Answer::Approve)
        );
        assert!(!DecisionKind::Input.answers().contains(&Answer::Expired));
        for text in [
            "approve",
            "deny",
            "applied",
            "not_applied",
            "accept",
            "decline",
            "cancel",
        ] {
            assert_eq!(Answer::parse(text).map(Answer::as_str), Some(text));
        }
    }
}
