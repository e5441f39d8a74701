//! The vault's integration tests: a real SQLite file, real HTTP servers on 127.0.0.1.

mod support;

mod audit_log;
mod cancellation;
mod crypto;
mod echo;
mod exfiltration;
mod failures;
mod hostile;
mod placement;
mod proxy;
mod secrecy;
