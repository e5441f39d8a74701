//! The server's own requests, sent in a stream while one of ours is open: a ping is
//! answered, an elicitation goes to the call's elicitor (or is declined), and what the
//! client never declared is refused.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::{McpClient, Operation, Session};
use crate::config::ElicitationPolicy;
use crate::deadline::MIN_LEG;
use crate::elicit::{ElicitationAnswer, ElicitationRequest};
use crate::stream::{Marks, NoticeSink, OnProgress, ServerRequest};

/// M14: the code of the error that refuses a request whose capability is not declared.
pub(super) const METHOD_NOT_FOUND: i64 = -32601;

/// M14/M15: what a request's legs need to answer the server's own requests and to hand
/// over its notices while the stream is open.
pub(super) struct Listen<'l> {
    pub(super) session: &'l Session,
    pub(super) tool: Option<&'l str>,
    pub(super) elicitor: Option<&'l crate::ElicitorHandle>,
    pub(super) sampler: Option<&'l crate::SamplerHandle>,
    pub(super) notices: Option<NoticeSink>,
    pub(super) marks: Arc<Mutex<Marks>>,
    pub(super) on_progress: Option<OnProgress>,
}

impl<'l> Listen<'l> {
    pub(super) fn plain(session: &'l Session) -> Self {
        Self {
            session,
            tool: None,
            elicitor: None,
            sampler: None,
            notices: None,
            marks: Arc::default(),
            on_progress: None,
        }
    }
}

impl McpClient {
    /// M14: the answer to one request the server sent in a stream, and the label of the
    /// leg that carries it: at once, except that an elicitation waits for its elicitor,
    /// within the operation's budget. [`Self::send_answer`] sends it.
    pub(super) async fn answer_to(
        &self,
        op: &Operation<'_>,
        listen: &Listen<'_>,
        request: ServerRequest,
    ) -> (&'static str, Value) {
        let (label, reply) = match request.method.as_str() {
            "ping" => ("ping answer", json!({"result": {}})),
            "elicitation/create" => (
                "elicitation answer",
                json!({"result": self.elicit(op, listen, &request.params).await}),
            ),
            "sampling/createMessage" if !self.server.sampling => (
                "sampling refusal",
                method_not_found(
                    "runwarden does not offer sampling (the capability is not declared)",
                ),
            ),
            "sampling/createMessage" => match self.sample(op, listen, &request.params).await {
                Some(result) => ("sampling answer", json!({"result": result})),
                None => (
                    "sampling refusal",
                    method_not_found(
                        "no one answers sampling for this call (its caller does not sample, or did not answer in time)",
                    ),
                ),
            },
            "roots/list" => (
                "roots refusal",
                method_not_found("runwarden does not offer roots (the capability is not declared)"),
            ),
            _ => (
                "unknown request refusal",
                method_not_found("method not found: runwarden does not handle this request"),
            ),
        };
        let mut message = reply;
        message["jsonrpc"] = json!("2.0");
        message["id"] = request.id;
        (label, message)
    }

    /// M14: sends an answer made by [`Self::answer_to`] on its own leg, within the
    /// operation's budget and signal.
    pub(super) async fn send_answer(
        &self,
        op: &Operation<'_>,
        listen: &Listen<'_>,
        (label, message): (&'static str, Value),
    ) {
        let sent = Box::pin(self.leg(op, Some(listen.session), label, message, None)).await;
        if let Err(error) = sent {
            tracing::info!(server = %self.server.name, %error, "the answer to a server request did not reach it");
        }
    }

    /// G2: the result of `sampling/createMessage` from the call's sampler, when the
    /// server's configuration passes sampling on and the call has one, within what is
    /// left of the budget (less a second for the answer's own leg); `None` refuses.
    async fn sample(
        &self,
        op: &Operation<'_>,
        listen: &Listen<'_>,
        params: &Value,
    ) -> Option<Value> {
        let sampler = listen.sampler?;
        let timeout = op
            .deadline
            .remaining()
            .saturating_sub(MIN_LEG.min(op.deadline.floor()));
        if timeout.is_zero() {
            return None;
        }
        let request = crate::SamplingRequest {
            server: self.server.name.clone(),
            tool: listen.tool.unwrap_or_default().to_string(),
            params: params.clone(),
            timeout,
        };
        tokio::time::timeout(timeout, sampler.0.sample(request))
            .await
            .ok()
            .flatten()
    }

    /// M14: the answer to `elicitation/create`. With the operator policy and an elicitor
    /// on the call, the elicitor is asked and given what is left of the budget (less a
    /// second for the answer's own leg); anything else, URL mode included, and an elicitor
    /// that does not answer in time, is a decline.
    pub(super) async fn elicit(
        &self,
        op: &Operation<'_>,
        listen: &Listen<'_>,
        params: &Value,
    ) -> Value {
        let decline = json!({"action": "decline"});
        let form = params.get("mode").and_then(Value::as_str).unwrap_or("form") == "form";
        let (true, ElicitationPolicy::Operator, Some(elicitor)) =
            (form, self.server.elicitation, listen.elicitor)
        else {
            return decline;
        };
        let timeout = op
            .deadline
            .remaining()
            .saturating_sub(MIN_LEG.min(op.deadline.floor()));
        if timeout.is_zero() {
            return decline;
        }
        let message: String = params
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .chars()
            .take(2_000)
            .collect();
        let request = ElicitationRequest {
            server: self.server.name.clone(),
            tool: listen.tool.unwrap_or_default().to_string(),
            message,
            requested_schema: params
                .get("requestedSchema")
                .cloned()
                .unwrap_or(Value::Null),
            timeout,
        };
        match tokio::time::timeout(timeout, elicitor.0.elicit(request)).await {
            Ok(ElicitationAnswer::Accept(content)) => {
                json!({"action": "accept", "content": content})
            }
            Ok(ElicitationAnswer::Cancel) => json!({"action": "cancel"}),
            Ok(ElicitationAnswer::Decline) | Err(_) => decline,
        }
    }
}

/// M14: a JSON-RPC error for a request whose capability we never declared.
fn method_not_found(message: &str) -> Value {
    json!({"error": {"code": METHOD_NOT_FOUND, "message": message}})
}
