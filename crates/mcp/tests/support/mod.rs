//! Fixtures for the MCP tests: the shared loopback vault of `runwarden-testkit` and a
//! scripted MCP server.

#![allow(dead_code, unreachable_pub)]

pub mod scripted;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use runwarden_mcp::{LegReport, ManualClock, McpCall, McpClient, ProtocolPolicy, ServerConfig};
use runwarden_testkit::LoopbackVault;
use serde_json::Value;

/// How long a test waits for an event before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A vault over a fresh SQLite file and an egress client that admits loopback (the
/// testkit's, with its audit helpers), and the MCP client these tests make from it.
pub struct Fixture(LoopbackVault);

impl Deref for Fixture {
    type Target = LoopbackVault;

    fn deref(&self) -> &LoopbackVault {
        &self.0
    }
}

pub async fn fixture() -> Fixture {
    Fixture(runwarden_testkit::loopback_vault().await)
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
