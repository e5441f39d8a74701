//! What can go wrong with a model call.

use runwarden_vault::{Delivery, EgressError};

/// Why a model call failed. The text never carries a secret or a request body.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The caller's signal cancelled the call.
    #[error("the model call was cancelled {}", if *in_flight { "in flight" } else { "before send" })]
    Cancelled {
        /// True when the request had gone out.
        in_flight: bool,
    },
    /// The provider answered with an error status.
    #[error("the model provider answered HTTP {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The provider's error message, one line, at most 200 characters.
        message: String,
    },
    /// The vault refused the call or the transport failed (timeout, connection, policy).
    #[error("the model call did not complete: {0}")]
    Egress(#[source] Box<EgressError>),
    /// The answer could not be understood.
    #[error("the model provider's answer is malformed: {0}")]
    Malformed(String),
    /// The answer's stream ended before its terminal event (`data: [DONE]`,
    /// `message_stop`): the model may have generated, been charged for and said more than
    /// arrived, so nothing of it is used (L3, V8: `maybe_delivered`).
    #[error("the model's answer stream was cut short: {detail}")]
    Incomplete {
        /// How far it got (bytes and deltas), never the text.
        detail: String,
    },
    /// The provider reported an error inside a streamed answer (an `error` event).
    #[error("the model provider reported an error mid-stream ({kind}): {message}")]
    Provider {
        /// The provider's error type (`overloaded_error`, `api_error`, ...).
        kind: String,
        /// The provider's message, one line, at most 200 characters.
        message: String,
    },
    /// The scripted plan has no turn left, or is invalid.
    #[error("the scripted plan: {0}")]
    Script(String),
}

impl ModelError {
    /// True for failures a retry may cure: 429, 5xx, timeouts and transport failures
    /// (R9 classifies queued runs by this).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            Self::Egress(e) => matches!(
                **e,
                EgressError::Timeout { .. }
                    | EgressError::Transport { .. }
                    | EgressError::Backstop { .. }
            ),
            // A cut stream is a transport failure by another name.
            Self::Incomplete { .. } => true,
            Self::Provider { kind, .. } => matches!(
                kind.as_str(),
                "overloaded_error" | "api_error" | "rate_limit_error" | "server_error"
            ),
            _ => false,
        }
    }

    /// V8: how far the call got, carried up from the vault unchanged. An answer the
    /// provider gave (an error status, a malformed body) was answered.
    pub fn delivery(&self) -> Delivery {
        match self {
            Self::Cancelled { in_flight: false } | Self::Script(_) => Delivery::NotSent,
            Self::Cancelled { in_flight: true } | Self::Incomplete { .. } => {
                Delivery::MaybeDelivered
            }
            Self::Egress(e) => e.delivery(),
            Self::Status { .. } | Self::Malformed(_) | Self::Provider { .. } => Delivery::Answered,
        }
    }

    /// True for a cancellation.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }
}
