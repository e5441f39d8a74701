//! Model providers for runwarden runs: one model turn per call, every byte through the
//! vault's guarded egress client, cancellable by the run's signal (L1, L2).
//!
//! A provider implements [`ModelProvider`]: given a [`ModelRequest`] (system prompt,
//! [`Message`]s, [`ToolSpec`]s) and an optional cancellation signal, it answers one
//! [`ModelTurn`] (text and [`ToolCallRequest`]s) or a [`ModelError`].
//!
//! - [`OpenAiCompatible`] speaks chat completions (OpenAI, Ollama, vLLM, llama.cpp server
//!   and the rest); its API key is a vault secret placed as a bearer token.
//! - [`Anthropic`] speaks the Messages API; its key goes in `x-api-key`.
//! - Both stream their answers by default (L3): a [`StreamAssembler`] reads the event
//!   stream as it arrives, so a cancel closes the stream and the server stops generating.
//! - [`Scripted`] replays a JSON plan with no network, for demos and tests.
//!
//! No provider ever holds a key: each names a vault secret and the vault places it on the
//! wire (V3). [`ModelError::is_retryable`] is what a retry policy asks (R9).
//!
//! ```no_run
//! # async fn example(egress: std::sync::Arc<runwarden_vault::EgressClient>) -> Result<(), runwarden_models::ModelError> {
//! use runwarden_models::{Message, ModelProvider, ModelRequest, OpenAiCompatible};
//! use runwarden_vault::{CancelFlag, SecretName};
//!
//! let mut model = OpenAiCompatible::new(egress, "https://api.openai.com/v1", "gpt-4o-mini");
//! model.api_key = Some(SecretName::new("openai").unwrap());
//! let request = ModelRequest {
//!     system: Some("You are terse.".into()),
//!     messages: vec![Message::User { text: "Say hello.".into() }],
//!     tools: Vec::new(),
//!     correlation: Some("run-1".into()),
//!     progress: None,
//!     max_tokens: None,
//! };
//! let stop = CancelFlag::new();
//! let turn = model.complete(&request, Some(&stop)).await?;
//! println!("{:?}", turn.text);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod anthropic;
mod call;
mod error;
mod openai;
mod parse;
mod provider;
mod scripted;
mod sse;
mod stream;

pub use anthropic::{ANTHROPIC_BASE_URL, ANTHROPIC_VERSION, Anthropic};
pub use call::{DEFAULT_MAX_TOKENS, DEFAULT_TIMEOUT, MAX_RESPONSE_BYTES};
pub use error::ModelError;
pub use openai::OpenAiCompatible;
pub use provider::{
    FinishReason, Message, ModelProvider, ModelRequest, ModelTurn, Progress, ToolCallRequest,
    ToolSpec, Usage,
};
pub use scripted::Scripted;
pub use stream::{StreamApi, StreamAssembler};
