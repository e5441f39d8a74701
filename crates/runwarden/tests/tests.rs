//! The `runwarden` binary as operators meet it: each test runs the real executable in a
//! scratch directory with its own `runwarden.toml` and a clean environment. The tests that
//! need a real peer, PostgreSQL, a model server or a browser are the `peer`, `postgres`,
//! `llama` and `browser` targets beside this one (`tests/peer/`, ...).

// The scratch installations, servers and clients every target of the binary shares.
#[allow(dead_code)] // some helpers serve other targets only
mod support;

mod api;
mod architecture;
mod audit;
mod backend;
mod budgets;
mod catalogue_freshness;
mod config;
mod demo;
mod deploy;
mod doctor;
mod effects;
mod egress;
mod exfiltration;
mod gateway;
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
mod policy;
mod queueing;
mod readiness;
mod reload;
mod rotate;
mod run;
mod secret;
mod secret_freshness;
mod sigil;
mod slow_clients;
mod stops;
mod telemetry;
mod tls;
mod user_text;
mod wal_removed;
mod worker;
