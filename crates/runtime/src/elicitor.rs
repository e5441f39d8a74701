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
use tokio::sync::broadcast::{self, error::RecvError};

use crate::decision::{
    Answer, AnswerOutcome, Decision, DecisionAnswer, DecisionAsk, DecisionKind, DecisionStatus,
    EXPIRED_REASON, SYSTEM_ACTOR, arguments_hash,
};
use crate::events::{DecisionAsked, EventBody};
use crate::feed::Change;
use crate::store::RunStore;
use crate::time::now_ms;

/// Asks a run's operator what an MCP server wants to know during one tool call.
#[derive(Clone)]
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
        let this = self.clone();
        Box::pin(async move { this.ask_and_wait(request).await })
    }
}

impl RunElicitor {
    /// Asks the operator and waits for the answer, at most the request's timeout.
    async fn ask_and_wait(self, request: ElicitationRequest) -> ElicitationAnswer {
        // Subscribed before the ask, so an answer that comes at once is not missed.
        let mut feed = self.store.change_feed().subscribe();
        let now = now_ms();
        let timeout_ms = i64::try_from(request.timeout.as_millis()).unwrap_or(i64::MAX);
        let decision = self.decision(&request, now, timeout_ms);
        let id = decision.id.clone();
        if !self.ask(decision).await {
            return ElicitationAnswer::Decline;
        }
        let deadline = tokio::time::Instant::now() + request.timeout;
        if let Some(answered) = answered(&*self.store, &self.run_id, &id, &mut feed, deadline).await
        {
            return reply(&answered);
        }
        // M14: nobody answered in time; the server hears "decline", the decision says
        // it expired (unless an answer won the race, which then counts).
        self.expire(&id, now.saturating_add(timeout_ms)).await
    }

    /// The pending `input` decision for the server's question, asked at `now`.
    fn decision(&self, request: &ElicitationRequest, now: i64, timeout_ms: i64) -> Decision {
        Decision {
            id: uuid::Uuid::now_v7().to_string(),
            run_id: self.run_id.clone(),
            kind: DecisionKind::Input,
            round: self.round,
            call_id: self.call_id.clone(),
            tool: self.tool.clone(),
            arguments_hash: arguments_hash(&self.arguments),
            arguments: self.arguments.clone(),
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
            in_call: false,
        }
    }

    /// Stores the decision and its `decision_asked` step; `false` when it was not asked.
    async fn ask(&self, decision: Decision) -> bool {
        let event = EventBody::DecisionAsked(DecisionAsked {
            decision_id: decision.id.clone(),
            kind: DecisionKind::Input,
            round: self.round,
            call_id: self.call_id.clone(),
            tool: self.tool.clone(),
            arguments_hash: decision.arguments_hash.clone(),
            expires_ms: decision.expires_ms,
            reissue: false,
        });
        let ask = DecisionAsk {
            decision,
            owner: self.owner.clone(),
            epoch: self.epoch,
            event_payload: event.to_payload(),
        };
        match self.store.decision_ask(ask).await {
            Ok(Some(_)) => true,
            Ok(None) => false, // the run is no longer ours
            Err(error) => {
                tracing::warn!(run = %self.run_id, %error, "could not ask the operator; declining the server's question");
                false
            }
        }
    }

    /// Records the decision as expired, no earlier than `due_ms`; an answer that won the
    /// race goes back to the server instead.
    async fn expire(&self, id: &str, due_ms: i64) -> ElicitationAnswer {
        let expiry = DecisionAnswer {
            id: id.to_string(),
            answer: Answer::Expired,
            reason: Some(EXPIRED_REASON.to_string()),
            arguments: None,
            content: None,
            actor: SYSTEM_ACTOR.to_string(),
            now_ms: now_ms().max(due_ms),
        };
        match self.store.decision_answer(expiry).await {
            Ok(AnswerOutcome::Refused(d, _)) if d.status == DecisionStatus::Answered => reply(&d),
            _ => ElicitationAnswer::Decline,
        }
    }
}

/// The decision `id` of run `run_id` once answered, read again each time the run's log
/// grows; `None` at the deadline. Subscribe to the feed before asking, so an answer that
/// comes at once is not missed.
pub(crate) async fn answered(
    store: &dyn RunStore,
    run_id: &str,
    id: &str,
    feed: &mut broadcast::Receiver<Change>,
    deadline: tokio::time::Instant,
) -> Option<Decision> {
    loop {
        match store.decision_get(id).await {
            Ok(Some(d)) if d.status != DecisionStatus::Pending => return Some(d),
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
            return None;
        }
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
