//! The OAuth 2.1 client of MCP servers, as the MCP authorization spec (2025-11-25) asks of
//! a client: discovery from a 401, issuer and resource checks, resource indicators, client
//! credentials and authorization code with PKCE, refresh with rotation, scope step-up, DPoP,
//! and the assertion grants: the JWT bearer grant for workload identity and
//! enterprise-managed authorization, an ID token exchanged for an ID-JAG.
//!
//! It sits between the vault and the MCP client: it knows OAuth and MCP's use of it, and
//! sends every request through the vault's guarded
//! [`EgressClient`](runwarden_vault::EgressClient). Tokens are vault records, sealed like
//! secrets ([`runwarden_vault::OAuthTokenRecord`], kind `internal`, never listed by
//! `secret list`). No public method returns one: a caller gets a
//! [`HeldToken`] whose [`Credential`](runwarden_vault::Credential) names the record with
//! [`Placement::OAuth`](runwarden_vault::Placement), and the egress client places the
//! access token at the wire. Every metadata, registration and token request is guarded
//! like any other target (a metadata document that points at a private address is
//! refused), is audited with its own action (`oauth_metadata`, `oauth_registration`,
//! `oauth_token`) and carries the caller's signal.
//!
//! - [`OAuthClient`]: one server's client: [`OAuthClient::credential`] before a request,
//!   [`OAuthClient::challenge`] after a 401 or 403, [`OAuthClient::status`] for
//!   `mcp auth status`.
//! - [`OAuthSettings`], [`Grant`], [`AuthMethod`]: what the operator configured.
//! - [`OAuthError`]: why a server got no token, and what to do.
//!
//! ```no_run
//! # async fn example(egress: std::sync::Arc<runwarden_vault::EgressClient>) -> Result<(), runwarden_oauth::OAuthError> {
//! use runwarden_oauth::{Grant, OAuthClient, OAuthSettings};
//!
//! let mut settings = OAuthSettings::new(Grant::ClientCredentials);
//! settings.client_id = Some("agent".into());
//! let client = OAuthClient::new(egress, "tickets", "https://mcp.example.com/mcp", settings)?;
//! if let Some(held) = client.credential(None).await? {
//!     println!("placing {}", held.credential.secret);
//! }
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod assertion;
mod authorization_code;
mod authorize;
mod challenge;
mod client;
mod crypto;
mod discovery;
mod dpop;
mod error;
mod id_jag;
mod jwt_bearer;
mod loopback;
mod record;
mod renew;
mod settings;
mod token_request;

pub use assertion::AssertionSource;
pub use authorization_code::LOGIN_WAIT;
pub use client::{AuthorizationPrompt, HeldToken, OAuthClient, OAuthStatus};
pub use crypto::SigningAlg;
pub use error::{AssertionLeg, OAuthError};
pub use settings::{AuthMethod, Grant, IdentityProvider, OAuthSettings};
