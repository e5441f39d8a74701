//! The MCP client's integration tests: scripted servers on 127.0.0.1 through a real vault.

mod support;

mod conformance;
mod echo;
mod liveness;
mod peer;
mod seams;
mod servers;
mod shape;
mod stateless;
mod wire;
