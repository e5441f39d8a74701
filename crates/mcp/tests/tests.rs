//! The MCP client's fast integration tests: scripted servers on 127.0.0.1 through a real
//! vault. The tests against the real Python peer are the `peer` target (`tests/peer/`).

mod support;

mod conformance;
mod echo;
mod liveness;
mod seams;
mod servers;
mod wire;
