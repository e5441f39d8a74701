//! What the server saw and issued: its counters, the requests its resources received,
//! and the access tokens it gave out.

use std::collections::BTreeMap;
use std::time::Instant;

/// What the server counted. Token requests count refused ones too.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Token requests by `grant_type` (answered or refused).
    pub token_requests: BTreeMap<String, usize>,
    /// Access tokens issued by `grant_type`.
    pub tokens_issued: BTreeMap<String, usize>,
    /// Token requests by the client authentication method used.
    pub auth_methods: BTreeMap<String, usize>,
    /// Successful refresh grants.
    pub refreshes: usize,
    /// Rotated-out refresh tokens presented again (each revokes its family).
    pub refresh_reuse: usize,
    /// Dynamic client registrations.
    pub registrations: usize,
    /// Authorization requests answered with a code.
    pub authorizations: usize,
    /// Metadata documents served, by path.
    pub metadata_requests: BTreeMap<String, usize>,
    /// Every error the token, authorization and registration endpoints answered, as
    /// `error: description`, in order: what a failing test prints.
    pub errors: Vec<String>,
    /// Token requests that carried a valid DPoP proof.
    pub dpop_token_proofs: usize,
    /// `use_dpop_nonce` answers, from the token endpoint and from the resources.
    pub dpop_nonce_challenges: usize,
    /// The `sub` of every JWT bearer assertion the token endpoint accepted, in order.
    pub assertion_subjects: Vec<String>,
}

impl Counters {
    /// Token requests of one grant type.
    pub fn token_requests(&self, grant: &str) -> usize {
        self.token_requests.get(grant).copied().unwrap_or(0)
    }

    /// Tokens issued by one grant type.
    pub fn issued(&self, grant: &str) -> usize {
        self.tokens_issued.get(grant).copied().unwrap_or(0)
    }
}

/// One request a protected resource received (metadata requests excluded).
#[derive(Debug, Clone)]
pub struct ResourceHit {
    /// The resource's URI (its RFC 8707 identifier).
    pub resource: String,
    /// The method and target.
    pub method: String,
    /// The access token presented, if any (with the Bearer or the DPoP scheme).
    pub bearer: Option<String>,
    /// The Authorization scheme it came with (`Bearer`, `DPoP`).
    pub scheme: Option<String>,
    /// The DPoP proof presented, if any: the thumbprint of its key when it checked out,
    /// else what was wrong with it.
    pub dpop: Option<Result<String, String>>,
    /// The status answered (the inner handler's when the token was accepted).
    pub status: u16,
}

/// An access token as issued.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// The client it was issued to.
    pub client_id: String,
    /// The resource it is bound to (RFC 8707), if the request named one.
    pub audience: Option<String>,
    /// Granted scopes.
    pub scopes: Vec<String>,
    /// The grant that produced it.
    pub grant: String,
    /// The thumbprint of the DPoP key it is bound to (`cnf.jkt`), if bound.
    pub jkt: Option<String>,
    pub(super) expires: Instant,
}

impl IssuedToken {
    /// Whether it is past its lifetime.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.expires
    }
}
