//! The credential vault: secrets at rest, a guarded egress client that places them at the
//! wire, and a hash-chained audit log of every outbound call.
//!
//! The vault knows nothing about runs, models or MCP; the OAuth client for MCP servers is
//! the crate above it (`runwarden-oauth`), and the vault keeps only what the wire needs of
//! it: the sealed token record ([`OAuthTokenRecord`]) and DPoP proofs ([`dpop`]). Callers
//! build an
//! [`EgressRequest`] that *names* a secret and a [`Placement`], hand it to
//! [`EgressClient::send`] with an optional [`CancellationSignal`], and get an
//! [`EgressResponse`] or a typed [`EgressError`]. No HTTP-library type crosses this API.
//!
//! - [`Vault`] seals secrets with envelope encryption ([`Algorithm`]) under a
//!   [`MasterKey`], rotates that key, and keeps the audit log ([`audit`]).
//! - [`EgressClient`] applies the egress guard ([`EgressPolicy`], DNS through a
//!   [`Resolver`]), places the credential, bounds and cancels the transfer, and audits
//!   the call: an intent row committed before any byte leaves (nothing is sent if it
//!   cannot be), then the outcome row naming it.
//! - [`EgressClient::serve_proxy`] serves the egress proxy of a local MCP server's sandbox
//!   (`CONNECT` and plain HTTP), each connection under the same guard and audit.
//! - [`store::VaultStore`] is the storage seam a backend implements.
//!
//! ```no_run
//! # async fn example(client: runwarden_vault::EgressClient) -> Result<(), runwarden_vault::EgressError> {
//! use runwarden_vault::{CancelFlag, Credential, EgressRequest, Method, Placement, SecretName};
//!
//! let stop = CancelFlag::new();
//! let request = EgressRequest::new(Method::Post, "https://mcp.example.com/mcp")
//!     .credential(Credential { secret: SecretName::new("tickets-token").unwrap(), placement: Placement::Bearer })
//!     .body(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec());
//! let response = client.send(request, Some(&stop)).await?;
//! println!("{}", response.status);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod anchoring;
pub mod audit;
mod audit_verify;
mod audit_writer;
mod delivery;
pub mod dpop;
mod egress;
mod envelope;
mod error;
mod exfiltration;
mod external_witness;
mod guard;
mod master_key;
mod matcher;
mod message;
mod oauth_token;
mod own_rows;
mod placement;
mod resolver;
mod scrub;
mod secret;
mod secret_index;
mod signal;
pub mod store;
mod tokens;
pub mod trace;
mod vault;
mod witness;

pub use audit::{AuditEvent, AuditRow, VerifyReport};
pub use delivery::Delivery;
pub use egress::{
    CallObserver, DEFAULT_BACKSTOP_TICK, EgressClient, EgressConfig, EnvironmentFor, MAX_TICK,
    PROXY_MAX_CONNECTIONS, ProxyLabel,
};
pub use envelope::Algorithm;
pub use error::{EgressError, VaultError};
pub use exfiltration::Redactor;
pub use guard::{EgressPolicy, GuardRefusal, PolicyError};
pub use master_key::MasterKey;
pub use message::{
    BeforeTransfer, CompleteFn, DEFAULT_MAX_RESPONSE_BYTES, EgressRequest, EgressResponse,
    HeadObserver, IntentObserver, Method,
};
pub use oauth_token::{OAUTH_TOKEN_PREFIX, OAuthTokenRecord};
pub use placement::{Credential, Placement};
pub use resolver::Resolver;
pub use secret::{SecretName, SecretValue};
pub use signal::{CancelFlag, CancellationSignal, WakeFuture};
pub use tokens::{
    ApiToken, ConsoleSession, Role, SessionStore, TokenValue, token_create, token_hash,
    token_verify,
};
pub use vault::Vault;
