//! Test-only helpers shared by runwarden's crates: a real HTTP/1.1 server on 127.0.0.1
//! whose answer to each request comes from a handler, and which reports connections,
//! requests and client-side closes as timestamped events; and [`Peer`], the real MCP
//! server of the official Python SDK, started per test; and [`TempCluster`], a real
//! PostgreSQL server in a temporary directory (or the shared one a test run started); and
//! [`LlamaServer`], a real model server (llama.cpp with SmolLM2-135M) on 127.0.0.1; and
//! [`AuthServer`], a real OAuth 2.1 authorization server whose tokens guard
//! [`ProtectedResource`]s, and [`TestIdentityProvider`], the enterprise identity provider of
//! cross-app access.
//!
//! ```no_run
//! # async fn example() {
//! use runwarden_testkit::{HttpReply, TestServer};
//! let mut server = TestServer::start(|_request| HttpReply::text(200, "ok")).await;
//! let url = server.url("/");
//! # let _ = url;
//! let request = server.next_request(std::time::Duration::from_secs(5)).await;
//! assert_eq!(request.method, "GET");
//! # }
//! ```

#![deny(missing_docs)]

mod echo;
mod hooked;
mod idp;
mod jwt;
mod llama;
mod mcp;
mod oauth;
mod otlp;
mod outside;
mod peer;
mod postgres;
mod server;
mod stats;
mod vault;

pub use echo::{
    Channel, HOSTILE_SIGIL, Spelling, echo_handler, echo_handler_spelt, find_decoded_form,
    find_form, forms_of, hostile_placements, json_decoded, received_credential,
};
pub use hooked::{Call, Detail, Hook, HookedStore, StoreAnswer, Strike};
pub use idp::{Exchange, TestIdentityProvider};
pub use jwt::{JWT_BEARER_ASSERTION, SigningKey};
pub use llama::LlamaServer;
pub use mcp::{mcp_handler, tool};
pub use oauth::{
    AuthMethod, AuthServer, ClientSpec, Counters, IssuedToken, Knobs, ProtectedResource,
    ResourceHit, pkce_challenge,
};
pub use otlp::{ExportedSpan, OtlpReceiver};
pub use outside::required_path;
pub use peer::{Peer, peer_command, pids_with_env, stdio_peer};
pub use postgres::TempCluster;
pub use server::{HttpReply, HttpRequest, Seen, TestServer, closed_port};
pub use stats::Dist;
pub use vault::{LoopbackVault, call_outcomes, loopback_vault, loopback_vault_with};
