//! One operation of the client: its deadline, the caller's signal and the legs it took, and
//! the reports a caller gets of them.

use std::sync::Mutex;
use std::time::Duration;

use runwarden_vault::CancellationSignal;

use crate::deadline::Deadline;

/// One HTTP exchange of an operation, for reports and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegReport {
    /// The JSON-RPC method.
    pub method: String,
    /// The bound the leg was sent with.
    pub granted: Duration,
    /// How long it took.
    pub elapsed: Duration,
    /// True when the leg got an HTTP answer.
    pub answered: bool,
    /// The id of the leg's intent row in the audit log, once it was committed (V7).
    pub audit_id: Option<i64>,
}

/// How one [`McpClient::send_request`](super::McpClient::send_request) went
/// ([`McpClient::last_request`](super::McpClient::last_request)).
#[derive(Debug, Clone)]
pub struct RequestTrail {
    /// The protocol version spoken, once a session was ready.
    pub protocol: Option<String>,
    /// Every leg of the operation, in order.
    pub legs: Vec<LegReport>,
    /// `(protocol X; tried A, B)`: what a failure's text adds so it names the version
    /// and the legs tried.
    pub trail: String,
}

/// One operation: its deadline, the caller's signal and the legs so far.
pub(super) struct Operation<'a> {
    pub(super) deadline: Deadline<'a>,
    pub(super) signal: Option<&'a dyn CancellationSignal>,
    pub(super) correlation: Option<String>,
    pub(super) legs: Mutex<Vec<LegReport>>,
    /// The protocol version of the session it used, once there was one.
    pub(super) protocol: Mutex<Option<String>>,
    /// The operator forced the call past the catalogue; its audit rows say so.
    pub(super) forced: bool,
}

impl Operation<'_> {
    pub(super) fn legs(self) -> Vec<LegReport> {
        self.legs.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// The protocol version the operation spoke, once a session was ready.
    pub(super) fn protocol(&self) -> Option<String> {
        self.protocol
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True when a leg of `method` went out and was answered in this operation.
    pub(super) fn answered(&self, method: &str) -> bool {
        self.legs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.method == method && l.answered)
    }

    /// What an error of this operation adds so it names the protocol version and what
    /// was tried: `(protocol 2025-11-25; tried server/discover, initialize, tools/call)`.
    pub(super) fn trail(&self) -> String {
        let legs = self.legs.lock().unwrap_or_else(|p| p.into_inner());
        let mut tried: Vec<&str> = Vec::new();
        for leg in legs.iter() {
            if tried.last() != Some(&leg.method.as_str()) {
                tried.push(&leg.method);
            }
        }
        let protocol = self.protocol().unwrap_or_else(|| "not negotiated".into());
        let tried = if tried.is_empty() {
            "nothing was sent".to_string()
        } else {
            format!("tried {}", tried.join(", "))
        };
        format!("(protocol {protocol}; {tried})")
    }

    /// True when the caller's own signal says stop (not the deadline's).
    pub(super) fn caller_cancelled(&self) -> bool {
        self.signal.is_some_and(|s| s.is_cancelled())
    }
}
