//! The `runwarden` binary as operators meet it: each test runs the real executable in a
//! scratch directory with its own `runwarden.toml` and a clean environment. The tests that
//! need a real peer, PostgreSQL, a model server or a browser are the `peer`, `postgres`,
//! `llama` and `browser` targets beside this one (`tests/peer/`, ...).

// Helpers shared with the targets that need an outside part (`peer/main.rs`, ...), where
// some of them are used only there.
#[allow(dead_code)]
mod api;
#[allow(dead_code)]
mod support;
#[allow(dead_code)]
mod worker;

mod architecture;
mod audit;
mod budgets;
mod config;
mod demo;
mod deploy;
mod doctor;
mod effects;
mod egress;
mod exfiltration;
mod getting_started;
mod hardening;
mod init;
mod json;
mod logs;
mod mcp;
mod mcp_edit;
mod metrics;
mod oauth;
mod oauth_assertion;
mod oauth_dpop;
mod operator_cli;
mod os_faults;
mod queueing;
mod readiness;
mod reload;
mod rotate;
mod run;
mod secret;
mod sigil;
mod slow_clients;
mod stops;
mod telemetry;
mod tls;
mod user_text;
mod wal_removed;
