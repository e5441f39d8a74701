//! V8: how far a request got, as a fact the vault reports with every outcome.

use serde::{Deserialize, Serialize};

/// Whether a request may have reached the server (V8).
///
/// The vault is the only layer that sees the wire, so it is the only one that decides.
/// Layers above carry the value up unchanged or make it *less* certain; none may turn
/// [`MaybeDelivered`](Self::MaybeDelivered) into [`NotSent`](Self::NotSent), because that
/// is how a write that reached the server gets made twice.
// Deserialize: the runtime reads a step's delivery back from its durable event (R11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Provably nothing of the request reached the server: refused, cancelled before
    /// send, the connection could not be made, or the budget was spent before the leg.
    NotSent,
    /// The request may have reached the server: anything after the connection could carry
    /// request bytes, including a timeout, a reset, a body cut short, or a stream that
    /// ended without our response.
    MaybeDelivered,
    /// The server answered.
    Answered,
}

impl Delivery {
    /// The stable text used in events and JSON (`not_sent`, `maybe_delivered`, `answered`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotSent => "not_sent",
            Self::MaybeDelivered => "maybe_delivered",
            Self::Answered => "answered",
        }
    }

    /// True when the request may have had an effect on the server.
    pub fn may_have_reached(self) -> bool {
        self != Self::NotSent
    }
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
