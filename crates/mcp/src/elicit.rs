//! The seam through which a server's `elicitation/create` reaches a person (M14, R12).
//!
//! The MCP client knows nothing about runs or decisions. When a server asks for input in
//! the middle of a `tools/call`, the client hands an [`ElicitationRequest`] to the
//! [`Elicitor`] the caller put on the [`McpCall`](crate::McpCall) and
//! sends back whatever [`ElicitationAnswer`] comes out. With no elicitor, or when the
//! server's policy is to decline, the client declines at once and never leaves the server
//! waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

/// One `elicitation/create` in form mode, as the server sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct ElicitationRequest {
    /// The server's local name.
    pub server: String,
    /// The remote tool whose call the question arrived in.
    pub tool: String,
    /// What the server wants to know, for the operator.
    pub message: String,
    /// The flat object schema the answer's content must match.
    pub requested_schema: Value,
    /// How long the server may wait for the answer; after it the client declines.
    pub timeout: Duration,
}

/// What goes back to the server.
#[derive(Debug, Clone, PartialEq)]
pub enum ElicitationAnswer {
    /// The operator answered; the content matches the requested schema.
    Accept(Map<String, Value>),
    /// The operator (or the policy, or the clock) said no.
    Decline,
    /// The operator dismissed the question without choosing.
    Cancel,
}

/// The future an [`Elicitor`] returns.
pub type ElicitationFuture = Pin<Box<dyn Future<Output = ElicitationAnswer> + Send>>;

/// Answers a server's questions during one tool call.
///
/// The runtime implements it by parking the question as an `input` decision (R12); the
/// answer must come within [`ElicitationRequest::timeout`], and the client declines on
/// its own if the future is still pending then.
pub trait Elicitor: Send + Sync {
    /// Ask, and wait for the answer.
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture;
}

/// A shareable [`Elicitor`] that prints as its name only.
#[derive(Clone)]
pub struct ElicitorHandle(pub Arc<dyn Elicitor>);

impl std::fmt::Debug for ElicitorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Elicitor")
    }
}

/// G2: one `sampling/createMessage` the server sent during a call, for a caller that passes
/// it on (a gateway client that declared it samples).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingRequest {
    /// The server's local name.
    pub server: String,
    /// The remote tool whose call the request arrived in.
    pub tool: String,
    /// The request's `params`, as the server sent them (scrubbed like every answer).
    pub params: Value,
    /// How long the server may wait; after it the client refuses.
    pub timeout: Duration,
}

/// The future a [`Sampler`] returns: the result to send back, or `None` to refuse.
pub type SamplingFuture = Pin<Box<dyn Future<Output = Option<Value>> + Send>>;

/// Answers a server's sampling requests during one tool call.
pub trait Sampler: Send + Sync {
    /// Pass it on, and wait for the result.
    fn sample(&self, request: SamplingRequest) -> SamplingFuture;
}

/// A shareable [`Sampler`] that prints as its name only.
#[derive(Clone)]
pub struct SamplerHandle(pub Arc<dyn Sampler>);

impl std::fmt::Debug for SamplerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sampler")
    }
}
