//! The policy step (P2, P3): before a tool call's approval, its fence and any byte of it,
//! and before each model call, the configured policies decide it. A denied tool call is
//! recorded as the call's step and an audit row and is what the model reads; an approval
//! requirement goes to an operator through the decisions that already exist. A model call
//! that is not allowed fails the run (it cannot wait for an operator). With no policies
//! nothing is evaluated.

use runwarden_models::ToolCallRequest;
use runwarden_policy::{Decision, Request, RunFacts, Target, Verdict};
use runwarden_vault::audit::action;
use runwarden_vault::{AuditEvent, Delivery, EgressClient};
use serde_json::{Map, Value};

use super::{Executor, Segment};
use crate::agent::BoundTool;
use crate::events::{EventBody, ModelFailed, PolicyNote, StepOutcome, ToolExecuted};
use crate::state::Outcome;
use crate::time::now_ms;

/// What the policies let a call do.
pub(super) enum Gate {
    /// Go on; the note for its step when policies decided it.
    Pass(Option<PolicyNote>),
    /// Denied, its step recorded: what the model reads.
    Denied(String),
    /// An operator must approve it first; the note, and the decision's message that
    /// names the policies.
    Approval(PolicyNote, String),
}

impl Executor {
    /// P2: the policies' decision about one call. `Err` when the segment lost the run
    /// while recording a denial.
    pub(super) async fn policy_gate(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        arguments: &Map<String, Value>,
    ) -> Result<Gate, Outcome> {
        let Some(policies) = &segment.agent.policy else {
            return Ok(Gate::Pass(None));
        };
        let server = tool.client.server();
        let request = Request {
            agent: segment.agent.name.clone(),
            agent_tags: segment.agent.tags.clone(),
            token: started_by(segment),
            target: Target::Tool {
                id: tool.spec.name.clone(),
                server: server.name.clone(),
                name: tool.remote_name.clone(),
                effect: tool.effect.as_str().to_string(),
            },
            arguments: arguments.clone(),
            run: run_facts(segment, round),
            // A local server has no host; it is named as its audit rows name it.
            host: match &server.stdio {
                Some(_) => server.url.clone(),
                None => host_of(&server.url).to_string(),
            },
        };
        let mut verdict = policies.decide(&request);
        if let Some(credential) = &server.auth {
            // P2: the secret the server's credential uses is decided too (`read_secret`);
            // the call goes only if both are allowed.
            let secret = Request {
                target: Target::Secret(credential.secret.as_str().to_string()),
                ..request.clone()
            };
            verdict = verdict.and(policies.decide(&secret));
        }
        let note = PolicyNote::from(&verdict);
        match verdict.decision {
            Decision::Allow => Ok(Gate::Pass(Some(note))),
            Decision::ApprovalRequired => {
                let answered = segment
                    .approvals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&call.id);
                // One row when the question is asked, none again when its answer is read.
                if !answered {
                    let egress = tool.client.egress();
                    audit_policy(segment, egress, &call.name, &request.host, &verdict).await;
                }
                Ok(Gate::Approval(note, verdict.summary()))
            }
            Decision::Deny => {
                let text = verdict.summary();
                let egress = tool.client.egress();
                audit_policy(segment, egress, &call.name, &request.host, &verdict).await;
                let mut step = ToolExecuted::refused(round, call, &text);
                step.outcome = StepOutcome::Denied;
                step.remote = Some(tool.remote_name.clone());
                step.server = Some(server.name.clone());
                step.effect = Some(tool.effect);
                step.sent = Some(false);
                step.policy = Some(Box::new(note));
                self.record_soft(segment, EventBody::ToolExecuted(step), None)
                    .await
                    .ok_or(Outcome::LeaseLost)?;
                Ok(Gate::Denied(text))
            }
        }
    }

    /// P2: the policies' decision about the round's model call (`Model::"NAME"`). A model
    /// call cannot wait for an operator, so one that needs approval is not made either.
    /// `Err` is the segment's outcome: the run failed, not to be retried (the same call
    /// would be decided the same way).
    pub(super) async fn model_gate(
        &self,
        segment: &Segment<'_>,
        round: u32,
    ) -> Result<(), Outcome> {
        let Some(policies) = &segment.agent.policy else {
            return Ok(());
        };
        let provider = &segment.agent.provider;
        let model = provider
            .model_name()
            .unwrap_or_else(|| "unknown".to_string());
        let request = Request {
            agent: segment.agent.name.clone(),
            agent_tags: segment.agent.tags.clone(),
            token: started_by(segment),
            target: Target::Model(model.clone()),
            arguments: Map::new(),
            run: run_facts(segment, round),
            host: provider
                .base_url()
                .map(|url| host_of(&url).to_string())
                .unwrap_or_default(),
        };
        let verdict = policies.decide(&request);
        let text = match verdict.decision {
            Decision::Allow => return Ok(()),
            Decision::Deny => verdict.summary(),
            Decision::ApprovalRequired => format!(
                "{}; a model call cannot wait for an operator",
                verdict.summary()
            ),
        };
        if let Some(egress) = provider.egress() {
            let subject = format!("model {model}");
            audit_policy(segment, &egress, &subject, &request.host, &verdict).await;
        }
        let body = EventBody::ModelFailed(ModelFailed {
            round,
            error: text.clone(),
            retryable: false,
            delivery: Delivery::NotSent,
        });
        if self.record_soft(segment, body, Some(round)).await.is_none() {
            return Err(Outcome::LeaseLost);
        }
        let reason = format!("the call to model {model} was not made: {text}");
        Err(self.fail(segment, reason, false).await)
    }
}

/// P3: the audit row of a denial or an approval requirement, through `egress`'s vault.
/// Nothing was sent, so a row that cannot be written is logged and the decision stands.
async fn audit_policy(
    segment: &Segment<'_>,
    egress: &EgressClient,
    subject: &str,
    host: &str,
    verdict: &Verdict,
) {
    let event = AuditEvent {
        time_ms: now_ms(),
        action: action::POLICY_DECIDED.to_string(),
        success: verdict.decision != Decision::Deny,
        secret: None,
        method: String::new(),
        host: host.to_string(),
        path: String::new(),
        status: 0,
        duration_ms: 0,
        error: None,
        // Ids and reasons come from the policy files, never from the arguments.
        reason: Some(format!(
            "{} {subject}: {}",
            verdict.decision.as_str(),
            verdict.summary()
        )),
        actor: "run".to_string(),
        correlation: Some(segment.run.id.clone()),
        intent_id: None,
    };
    if let Err(error) = egress.vault().audit_record(event).await {
        tracing::error!(run = %segment.run.id, subject, %error, "the policy decision stands but its audit row could not be written");
    }
}

/// What a policy may read of the run (`context.run`).
fn run_facts(segment: &Segment<'_>, round: u32) -> RunFacts {
    RunFacts {
        id: segment.run.id.clone(),
        tags: segment.run.origin.tags.clone(),
        step: i64::from(round),
    }
}

/// P2: the token that started the run, by name: the agent's parent `Token::"NAME"`.
fn started_by(segment: &Segment<'_>) -> Option<String> {
    segment.run.origin.started_by.clone()
}

/// The host of a server's URL (`files.example` of `https://u@files.example:8443/mcp`);
/// empty when it has none.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if let Some(bracketed) = host.strip_prefix('[') {
        return bracketed.split(']').next().unwrap_or("");
    }
    host.split(':').next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_is_the_url_without_user_port_or_path() {
        assert_eq!(
            host_of("https://u:p@files.example:8443/mcp?x=1"),
            "files.example"
        );
        assert_eq!(host_of("http://127.0.0.1:9/mcp"), "127.0.0.1");
        assert_eq!(host_of("http://[::1]:9/mcp"), "::1");
        assert_eq!(host_of("nonsense"), "nonsense");
    }
}
