//! The model providers' integration tests: fake model servers on 127.0.0.1 through a real
//! vault over SQLite, and the scripted provider's plans. The tests against a real model
//! server are the `llama` target (`tests/llama/`).

mod support;

mod anthropic;
mod echo;
mod failures;
mod openai;
mod scripted;
mod stream;
mod streaming;
