//! The `runwarden` binary as operators meet it: each test runs the real executable in a
//! scratch directory with its own `runwarden.toml` and a clean environment.

mod api;
mod architecture;
mod audit;
mod backend;
mod budgets;
mod config;
mod conformance_suite;
mod decisions;
mod demo;
mod deploy;
mod effects;
mod egress;
mod hardening;
mod init;
mod json;
mod llama;
mod logs;
mod mcp;
mod mcp_edit;
mod metrics;
mod nodes;
mod oauth;
mod operator_cli;
mod queueing;
mod reload;
mod rotate;
mod run;
mod secret;
mod sigil;
mod stops;
mod support;
mod telemetry;
mod tls;
mod wire;
mod worker;
