//! Fixtures for the MCP tests: a vault over a real SQLite file and a scripted MCP server.

#![allow(dead_code, unreachable_pub)]

pub mod scripted;

use std::sync::Arc;
use std::time::Duration;

use runwarden_mcp::{LegReport, ManualClock, McpCall, McpClient, ProtocolPolicy, ServerConfig};
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{AuditRow, EgressClient, Vault};
use serde_json::Value;

/// How long a test waits for an event before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A vault over a fresh SQLite file and an egress client that admits loopback.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub vault: Arc<Vault>,
    pub egress: Arc<EgressClient>,
}

pub async fn fixture() -> Fixture {
    let runwarden_testkit::LoopbackVault {
        dir, vault, egress, ..
    } = runwarden_testkit::loopback_vault().await;
    Fixture { dir, vault, egress }
}

impl Fixture {
    /// A client for `url` named `tickets`, on `clock` when given.
    pub fn client(&self, url: String, clock: Option<Arc<ManualClock>>) -> McpClient {
        let client = McpClient::new(
            ServerConfig::new("tickets", url).with_protocol(ProtocolPolicy::Handshake),
            self.egress.clone(),
        );
        match clock {
            Some(clock) => client.with_clock(clock),
            None => client,
        }
    }

    /// Every audit row, oldest first.
    pub async fn audit(&self) -> Vec<AuditRow> {
        self.vault.audit_list(AuditFilter::default()).await.unwrap()
    }

    /// The outcome action of every call, oldest first; each intent row is checked to be
    /// completed and left out (V7 amended).
    pub async fn audit_actions(&self) -> Vec<String> {
        runwarden_testkit::call_outcomes(&self.audit().await)
    }
}

/// A call of `tool` with `arguments` (a JSON object) and nothing else set.
pub fn call(tool: &str, arguments: Value) -> McpCall {
    McpCall {
        tool: tool.into(),
        arguments: arguments.as_object().unwrap().clone(),
        ..McpCall::default()
    }
}

/// The method of each leg of an operation, in order.
pub fn methods(legs: &[LegReport]) -> Vec<&str> {
    legs.iter().map(|l| l.method.as_str()).collect()
}
