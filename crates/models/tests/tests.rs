//! The model providers' integration tests: fake model servers on 127.0.0.1 through a real
//! vault over SQLite, and the scripted provider's plans.

mod support;

mod anthropic;
mod echo;
mod failures;
mod llama;
mod openai;
mod scripted;
mod stream;
mod streaming;
