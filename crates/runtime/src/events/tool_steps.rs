//! The tool steps: a call made, refused or denied, and a write whose effect is unknown.

use runwarden_mcp::Effect;
use runwarden_models::ToolCallRequest;
use runwarden_vault::Delivery;
use serde::{Deserialize, Serialize};

/// How a tool step ended, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// The tool answered with a result.
    Succeeded,
    /// The tool answered with an error result.
    ToolError,
    /// The call failed.
    Failed,
    /// The call was cancelled.
    Cancelled,
    /// The runtime refused the call before anything was sent (no such tool, arguments
    /// that are not an object).
    Refused,
    /// An operator denied the call (or its approval expired), or a policy denied it;
    /// nothing was sent (R12, P3).
    Denied,
}

impl StepOutcome {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::ToolError => "tool_error",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
            Self::Denied => "denied",
        }
    }
}

/// `tool_executed`: one tool call as a step (R2). A call the runtime refused carries only
/// the round, the call, the tool, the outcome and the text; the other fields are absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolExecuted {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The tool's name on its server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// The server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The tool's effect at bind time (M10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// How it ended.
    pub outcome: StepOutcome,
    /// How far the `tools/call` got (V8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Whether it may have reached the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<bool>,
    /// What the model reads.
    pub text: String,
    /// P3: which policies decided the call, when policies are configured. Boxed: every
    /// event body stays small, and most steps have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Box<PolicyNote>>,
}

/// P3: the policy decision about one call as its step records it: the decision, the ids
/// of the policies that determined it and their reasons; never an argument's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyNote {
    /// `allow`, `deny` or `approval_required`.
    pub decision: String,
    /// The determining policies' ids; empty when nothing permitted the call.
    pub policies: Vec<String>,
    /// Their reasons.
    pub reasons: Vec<String>,
}

impl From<&runwarden_policy::Verdict> for PolicyNote {
    fn from(verdict: &runwarden_policy::Verdict) -> Self {
        Self {
            decision: verdict.decision.as_str().to_string(),
            policies: verdict.policies.clone(),
            reasons: verdict.reasons.clone(),
        }
    }
}

impl ToolExecuted {
    /// A call the runtime refused before anything was sent.
    pub fn refused(round: u32, call: &ToolCallRequest, text: &str) -> Self {
        Self {
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            remote: None,
            server: None,
            effect: None,
            outcome: StepOutcome::Refused,
            delivery: None,
            sent: None,
            text: text.to_string(),
            policy: None,
        }
    }
}

/// One HTTP leg of an uncertain write, with its audit intent row (V7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leg {
    /// The JSON-RPC method.
    pub method: String,
    /// True when the leg got an HTTP answer.
    pub answered: bool,
    /// The leg's intent row in the audit log, once committed.
    pub audit_id: Option<i64>,
    /// How long it took.
    pub millis: u64,
}

/// `effect_uncertain`: a write whose call may have reached the server and got no answer
/// (R11). Its fence stays; a non-idempotent one is never sent again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectUncertain {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The tool's name on its server.
    pub remote: String,
    /// The server.
    pub server: String,
    /// The write's effect.
    pub effect: Effect,
    /// How it ended.
    pub outcome: StepOutcome,
    /// How far the call got: `maybe_delivered`.
    pub delivery: Delivery,
    /// Whether it may have reached the server.
    pub sent: bool,
    /// What the model reads.
    pub text: String,
    /// The JSON-RPC id of the `tools/call`, once one was sent.
    pub request_id: Option<i64>,
    /// Every leg of the operation, in order.
    pub legs: Vec<Leg>,
}
