//! Progress reports written while a call runs: how far the model has streamed, and what a
//! tool's server says of its progress and in its logs. Resumption ignores them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `model_progress`: how far a streaming model call has got (L6), written at most a few
/// times a second while the stream runs. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelProgress {
    /// The round.
    pub round: u32,
    /// Output tokens generated so far in this call.
    pub tokens: u64,
}

/// `tool_progress`: a server's `notifications/progress` for a running tool call (M15),
/// throttled to at most a few a second. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolProgress {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The progress so far, as the server counts it.
    pub progress: f64,
    /// The total, when the server knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// The server's message, when it sent one (bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `tool_log`: a server's `notifications/message` during a tool call (M15), bounded in
/// size and number per call. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolLog {
    /// The model round that asked for the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// The tool's local name.
    pub tool: String,
    /// The syslog level the server gave (`info`, `warning`, ...).
    pub level: String,
    /// The server's logger name, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<String>,
    /// The logged data, cut to a bounded size.
    pub data: Value,
}

/// `limit_wait`: a call found one of its limits full and began to wait (R14). Nothing was
/// sent. Informational: resumption ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitWait {
    /// The model round.
    pub round: u32,
    /// The model's id for a tool call; `None` for a model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The tool's local name, or `model` for a model call.
    pub call: String,
    /// The limit that was full, in words (`concurrency limit of server t (4 at once)`).
    pub limit: String,
}

/// `limit_waited`: a call's wait for its limits ended (R14): `taken` (the call goes on),
/// `timed_out`, `cancelled` or `unavailable` (nothing was sent). Informational.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitWaited {
    /// The model round.
    pub round: u32,
    /// The model's id for a tool call; `None` for a model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The tool's local name, or `model` for a model call.
    pub call: String,
    /// The limit the call waited for, in words.
    pub limit: String,
    /// How the wait ended.
    pub outcome: String,
    /// How long it lasted.
    pub waited_ms: u64,
}
