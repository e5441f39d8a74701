//! An MCP client over Streamable HTTP whose every byte goes through the runwarden vault.
//!
//! [`McpClient`] talks to one server declared by a [`ServerConfig`]. It negotiates the
//! protocol: the stateless 2026-07-28 revision when the server serves it (probed with
//! `server/discover`), else the `initialize` handshake (offers
//! 2025-11-25; accepts 2025-06-18 and 2025-03-26), whose session it keeps until
//! [`McpClient::close`] ends it, answers the server's own requests, hands
//! progress and log [`Notice`]s to the caller, resumes broken event streams, spends one
//! deadline per operation across its legs,
//! and takes a [`CancellationSignal`](runwarden_vault::CancellationSignal) in exactly three
//! places: [`McpClient::call_tool`], [`McpClient::send_request`] and
//! [`McpClient::send_notification`]. Tool results, failures and cancellations come back
//! as a [`ToolResult`] the model can read. The crate knows nothing about runs.
//!
//! ```no_run
//! # async fn example(egress: std::sync::Arc<runwarden_vault::EgressClient>) {
//! use runwarden_mcp::{McpClient, ServerConfig, McpCall};
//!
//! let client = McpClient::new(ServerConfig::new("tickets", "https://mcp.example.com/mcp"), egress);
//! let call = McpCall { tool: "search".into(), ..Default::default() };
//! let outcome = client.call_tool(call, None).await;
//! println!("{}", outcome.result.text);
//! # }
//! ```

#![deny(missing_docs)]

mod catalogue;
mod client;
mod config;
mod deadline;
mod elicit;
mod error;
mod known;
mod naming;
mod result;
mod schema;
mod sse;
mod stateless;
pub mod stdio;
mod stream;
mod versions;

pub use catalogue::{
    CatalogueEntry, CatalogueStore, Contact, KnownProtocol, ListedTool, SchemaStatus, ServerHealth,
    StoredSchema, build_catalogue, stored_catalogue,
};
pub use client::{
    CLOSE_BUDGET, CallGate, GateFuture, LegReport, MAX_RESUMES, McpCall, McpClient, Notification,
    Reply, Request, RequestTrail, ToolCall, USER_AGENT,
};
pub use config::{
    DEFAULT_MAX_RESPONSE_BYTES, Effect, ElicitationPolicy, MAX_RESPONSE_BYTES_CEILING,
    ProtocolPolicy, ServerConfig, ServerConfigError,
};
pub use deadline::{Clock, MIN_BUDGET, ManualClock};
pub use elicit::{
    ElicitationAnswer, ElicitationFuture, ElicitationRequest, Elicitor, ElicitorHandle, Sampler,
    SamplerHandle, SamplingFuture, SamplingRequest,
};
pub use error::McpError;
pub use result::{ToolOutcome, ToolResult};
pub use stateless::{InputRequest, InputRequired, InputResume, STATELESS_VERSION};
pub use stream::{Notice, NoticeSink};
