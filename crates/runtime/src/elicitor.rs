//! M14, R12: the runtime's [`Elicitor`]. A server's `elicitation/create` during a tool
//! call becomes an `input` decision of the run; the call waits for the operator's answer
//! at most the request's timeout, then declines (and the decision is recorded as expired).
//!
//! The run keeps its lease while it waits: the HTTP call is live and cannot be released,
//! so unlike an approval the run is not parked. The wait is woken by the store's change
//! feed (the answer appends `decision_answered` to the run's log, announced in process, by
//! NOTIFY on PostgreSQL, and by the other-writers look on SQLite), never by a poll loop.

use std::sync::Arc;

use runwarden_mcp::{ElicitationAnswer, ElicitationFuture, ElicitationRequest, Elicitor};
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use crate::decision::{
    Answer, AnswerOutcome, Decision, DecisionAnswer, DecisionAsk, DecisionKind, DecisionStatus,
    EXPIRED_REASON, SYSTEM_ACTOR, arguments_hash,
};
use crate::events::{DecisionAsked, EventBody};
use crate::feed::Change;
use crate::store::RunStore;
use crate::time::now_ms;

/// Asks a run's operator what an MCP server wants to know during one tool call.
pub struct RunElicitor {
    store: Arc<dyn RunStore>,
    run_id: String,
    owner: String,
    epoch: i64,
    round: u32,
    call_id: String,
    tool: String,
    arguments: Value,
}

impl RunElicitor {
    /// The elicitor of one tool call (`call_id`, local name `tool`, the model's
    /// `arguments`) of a run that `owner` holds under claim epoch `epoch`.
    #[allow(clippy::too_many_arguments)] // one call site, each argument a different fact
    pub fn new(
        store: Arc<dyn RunStore>,
        run_id: &str,
        owner: &str,
        epoch: i64,
        round: u32,
        call_id: &str,
        tool: &str,
        arguments: Value,
    ) -> Self {
        Self {
            store,
            run_id: run_id.to_string(),
            owner: owner.to_string(),
            epoch,
            round,
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            arguments,
        }
    }
}

impl Elicitor for RunElicitor {
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture {
        let (store, run_id, owner) = (self.store.clone(), self.run_id.clone(), self.owner.clone());
        let epoch = self.epoch;
        let (round, call_id, tool, arguments) = (
            self.round,
            self.call_id.clone(),
            self.tool.clone(),
            self.arguments.clone(),
        );
        Box::pin(async move {
            // Subscribed before the ask, so an answer that comes at once is not missed.
            let mut feed = store.change_feed().subscribe();
            let now = now_ms();
            let timeout_ms = i64::try_from(request.timeout.as_millis()).unwrap_or(i64::MAX);
            let decision = Decision {
                id: uuid::Uuid::now_v7().to_string(),
                run_id: run_id.clone(),
                kind: DecisionKind::Input,
                round,
                call_id: call_id.clone(),
                tool: tool.clone(),
                arguments_hash: arguments_hash(&arguments),
                arguments,
                message: Some(format!("{} asks: {}", request.server, request.message)),
                requested_schema: Some(request.requested_schema.clone()),
                asked_ms: now,
                expires_ms: now.saturating_add(timeout_ms),
                status: DecisionStatus::Pending,
                answer: None,
                reason: None,
                answer_arguments: None,
                content: None,
                actor: None,
                answered_ms: None,
                reissue: None,
            };
            let id = decision.id.clone();
            let event = EventBody::DecisionAsked(DecisionAsked {
                decision_id: id.clone(),
                kind: DecisionKind::Input,
                round,
                call_id,
                tool,
                arguments_hash: decision.arguments_hash.clone(),
                expires_ms: decision.expires_ms,
                reissue: false,
            });
            let ask = DecisionAsk {
                decision,
                owner,
                epoch,
                event_payload: event.to_payload(),
            };
            match store.decision_ask(ask).await {
                Ok(Some(_)) => {}
                Ok(None) => return ElicitationAnswer::Decline, // the run is no longer ours
                Err(error) => {
                    tracing::warn!(run = %run_id, %error, "could not ask the operator; declining the server's question");
                    return ElicitationAnswer::Decline;
                }
            }
            let deadline = tokio::time::Instant::now() + request.timeout;
            loop {
                match store.decision_get(&id).await {
                    Ok(Some(d)) if d.status != DecisionStatus::Pending => return reply(&d),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(run = %run_id, %error, "could not read the operator's answer")
                    }
                }
                let woken = tokio::time::timeout_at(deadline, async {
                    loop {
                        match feed.recv().await {
                            Ok(Change::Appended { run_id: r, .. }) if r == run_id => return,
                            Ok(Change::Resync) | Err(RecvError::Lagged(_)) => return,
                            Ok(_) => {}
                            // A closed feed wakes nothing more: wait out the deadline.
                            Err(RecvError::Closed) => std::future::pending::<()>().await,
                        }
                    }
                })
                .await;
                if woken.is_err() {
                    break;
                }
            }
            // M14: nobody answered in time; the server hears "decline", the decision says
            // it expired (unless an answer won the race, which then counts).
            let expiry = DecisionAnswer {
                id: id.clone(),
                answer: Answer::Expired,
                reason: Some(EXPIRED_REASON.to_string()),
                arguments: None,
                content: None,
                actor: SYSTEM_ACTOR.to_string(),
                now_ms: now_ms().max(now.saturating_add(timeout_ms)),
            };
            match store.decision_answer(expiry).await {
                Ok(AnswerOutcome::Refused(d, _)) if d.status == DecisionStatus::Answered => {
                    reply(&d)
                }
                _ => ElicitationAnswer::Decline,
            }
        })
    }
}

/// The answer that goes back to the server.
fn reply(decision: &Decision) -> ElicitationAnswer {
    match (decision.answer, &decision.content) {
        (Some(Answer::Accept), Some(Value::Object(content))) => {
            ElicitationAnswer::Accept(content.clone())
        }
        (Some(Answer::Cancel), _) => ElicitationAnswer::Cancel,
        _ => ElicitationAnswer::Decline,
    }
}
