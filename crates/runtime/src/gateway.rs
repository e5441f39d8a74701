//! Gateway runs (G1): another agent's MCP session through runwarden. The session is a
//! run of its own; each `tools/call` the client makes is a step of it, made by the
//! executor exactly as an agent's tool call is (the policies, the limits, the write
//! fence, the vault, the audit), and the run's cancel stops the calls in flight.
//!
//! The binary speaks MCP to the client and hands each call to
//! [`Executor::serve_gateway`](crate::Executor::serve_gateway) as a [`GatewayRequest`];
//! the answer comes back as a [`GatewayReply`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use runwarden_mcp::{ElicitorHandle, NoticeSink, SamplerHandle};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::state::Outcome;

/// The agent name every gateway run is stored under: `runs --agent gateway` lists them.
pub const GATEWAY_AGENT: &str = "gateway";

/// The tag every gateway run carries, beside the token's own.
pub const GATEWAY_TAG: &str = "gateway";

/// One `tools/call` of a gateway client.
pub struct GatewayCall {
    /// The call's id within the run, unique per session (the client's request id).
    pub call_id: String,
    /// The tool's local name, as the client saw it in `tools/list`.
    pub tool: String,
    /// The arguments as the client sent them.
    pub arguments: Value,
    /// Set (and the run woken through the cancel hub) when the client cancels this call
    /// or goes away: it stops this call alone.
    pub stop: Arc<AtomicBool>,
    /// Receives the call's progress and logs, for the client.
    pub notices: Option<NoticeSink>,
    /// G2: asks the client the server's questions during the call (a client that declared
    /// it can answer them); `None`: they go to an operator, as for an agent's call.
    pub elicitor: Option<ElicitorHandle>,
    /// G2: passes the server's sampling requests to the client (one that declared it
    /// samples); `None`: they are refused.
    pub sampler: Option<SamplerHandle>,
}

impl std::fmt::Debug for GatewayCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayCall")
            .field("call_id", &self.call_id)
            .field("tool", &self.tool)
            .finish_non_exhaustive()
    }
}

/// A call and where its answer goes.
#[derive(Debug)]
pub struct GatewayRequest {
    /// The call.
    pub call: GatewayCall,
    /// The answer; dropped unanswered only when the session ends first.
    pub reply: oneshot::Sender<GatewayReply>,
}

/// What a gateway call came to.
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayReply {
    /// The tool's result, or why the call was refused or failed: what the client reads
    /// as a `tools/call` result.
    Result {
        /// The text (scrubbed by the vault).
        text: String,
        /// The result's `structuredContent`, when it had one.
        structured: Option<Value>,
        /// The result's `content` blocks as the server sent them (images, audio and
        /// resources included); empty when the answer is runwarden's own (`text` then).
        content: Vec<Value>,
        /// The client reads it as an error (`isError`).
        is_error: bool,
    },
    /// The client's own cancel stopped the call. `uncertain`: a write that may have
    /// reached its server (its fence is kept).
    CancelledByClient {
        /// The write may have taken effect.
        uncertain: bool,
    },
    /// An operator stopped this call alone (the binary's stop); the session goes on.
    /// `uncertain`: a write that may have reached its server (its fence is kept).
    CancelledByOperator {
        /// The write may have taken effect.
        uncertain: bool,
    },
    /// The run ended while the call was open: an operator cancelled it, its lease was
    /// lost, or a write could not be recorded. The session is over.
    Ended {
        /// How the run ended.
        outcome: Outcome,
        /// The call was a write that may have reached its server before the end.
        uncertain: bool,
    },
}

impl GatewayReply {
    /// A refusal or failure the client reads as the tool's error.
    pub(crate) fn error(text: impl Into<String>) -> Self {
        Self::Result {
            text: text.into(),
            structured: None,
            content: Vec::new(),
            is_error: true,
        }
    }
}

/// The text a client reads when a non-idempotent write may have taken effect without an
/// answer (R11): it must not be sent again until a person has looked.
pub(crate) fn uncertain_text(tool: &str, text: &str) -> String {
    format!(
        "the outcome of {tool} is unknown: the request may have reached the server and no answer came back ({text}). It was not retried and must not be retried until a person has checked whether it took effect; this session makes no more writes"
    )
}

/// The text a client reads for a write refused because an earlier write of the session
/// is uncertain.
pub(crate) const FENCED_SESSION: &str = "refused: an earlier write in this session may have taken effect without an answer, so this session makes no more writes; a person must check it first (see the run's events)";

/// G2: keeps only the tools of `agent` that the policies could let `token`'s client call,
/// whatever the arguments: a tool every call of which would be denied is not shown. With
/// no policies every tool is kept. Each call is still decided when it is made.
pub fn keep_visible(agent: &mut crate::AgentSpec, token: &str) {
    let Some(policies) = agent.policy.clone() else {
        return;
    };
    let (name, tags) = (agent.name.clone(), agent.tags.clone());
    agent.tools.retain(|tool| {
        policies.could_allow(&runwarden_policy::Request {
            agent: name.clone(),
            agent_tags: tags.clone(),
            token: Some(token.to_string()),
            target: runwarden_policy::Target::Tool {
                id: tool.spec.name.clone(),
                server: tool.client.server().name.clone(),
                name: tool.remote_name.clone(),
                effect: tool.effect.as_str().to_string(),
            },
            arguments: serde_json::Map::new(),
            run: runwarden_policy::RunFacts::default(),
            host: String::new(),
        })
    });
}
