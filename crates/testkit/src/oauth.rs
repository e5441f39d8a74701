//! A real OAuth 2.1 authorization server on 127.0.0.1, and protected resources that check
//! its bearer tokens: what the OAuth client (`runwarden-oauth`, M18) is tested against.
//! Standards are the interface: RFC 8414 and OpenID discovery, RFC 9728 protected resource metadata,
//! RFC 7591 dynamic registration, PKCE S256, RFC 9207 `iss`, RFC 8707 resource indicators,
//! client credentials with `client_secret_basic`, `client_secret_post` and
//! `private_key_jwt` (RFC 7523), refresh tokens that rotate, with reuse detected,
//! DPoP-bound tokens with nonces (RFC 9449, in [`dpop`]), and the JWT bearer grant
//! (RFC 7523) of assertions from issuers it trusts, ID-JAGs included (`oauth/jwt_grant.rs`).
//!
//! The authorization endpoint approves at once and redirects, so a plain HTTP client that
//! follows redirects completes a login. [`Knobs`] make the server misbehave on purpose, and
//! [`Counters`] and [`ResourceHit`]s say what it saw.
//!
//! Here: the server, its shared state and its routes. Beside it: the clients and their
//! authentication (`clients`), the authorization endpoint (`authorize`), the token
//! endpoint and its grants (`token`, `jwt_grant`, `dpop`), the protected resources
//! (`resource`), the knobs (`knobs`) and what it saw (`seen`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use crate::jwt::random_token;
use crate::server::{HttpReply, HttpRequest, TestServer};

mod authorize;
mod clients;
mod dpop;
pub(crate) mod jwt_grant;
mod knobs;
mod resource;
mod seen;
mod token;

use authorize::{Code, authorization};
pub use clients::{AuthMethod, ClientSpec};
use clients::{authenticate, registration};
pub use knobs::Knobs;
use resource::{ResourceConfig, protected_resource};
pub use seen::{Counters, IssuedToken, ResourceHit};
pub(crate) use token::issue;
use token::{RefreshToken, token};

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) issuer: String,
    knobs: Knobs,
    clients: HashMap<String, ClientSpec>,
    codes: HashMap<String, Code>,
    access: HashMap<String, IssuedToken>,
    refresh: HashMap<String, RefreshToken>,
    revoked_families: HashSet<u64>,
    next_family: u64,
    pub(crate) assertion_ids: HashSet<String>,
    pub(crate) counters: Counters,
    hits: Vec<ResourceHit>,
    /// Every DPoP proof `jti` seen, at the token endpoint and the resources.
    dpop_jtis: HashSet<String>,
    /// The nonces the token endpoint and the resources demand (with `dpop_nonces`).
    dpop_nonce_as: String,
    dpop_nonce_rs: String,
    /// The key the token being issued is bound to: set by the token endpoint from the
    /// request's proof, taken by `issue`.
    issuing_jkt: Option<String>,
    /// The JWT bearer grant: issuer to its public keys (JWKs).
    pub(crate) trusted_issuers: HashMap<String, Vec<Value>>,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A handler that panicked mid-update leaves maps that are still usable for a test.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The authorization server; it stops when dropped. Its issuer is its base URL.
pub struct AuthServer {
    /// The HTTP server (its events show every request).
    pub server: TestServer,
    shared: Shared,
}

impl AuthServer {
    /// Starts a server with default [`Knobs`]. Ready when this returns.
    pub async fn start() -> Self {
        Self::start_with(Knobs::default()).await
    }

    /// Starts a server with `knobs`.
    pub async fn start_with(knobs: Knobs) -> Self {
        let shared: Shared = Arc::new(Mutex::new(State {
            knobs,
            dpop_nonce_as: format!("as-{}", random_token(9)),
            dpop_nonce_rs: format!("rs-{}", random_token(9)),
            ..State::default()
        }));
        let handler_state = shared.clone();
        let server =
            TestServer::start(move |request| authorization_server(&handler_state, request)).await;
        lock(&shared).issuer = format!("http://{}", server.addr);
        Self { server, shared }
    }

    /// The issuer identifier, `http://127.0.0.1:PORT` (no trailing slash).
    pub fn issuer(&self) -> String {
        lock(&self.shared).issuer.clone()
    }

    /// The issuer followed by `path`.
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    /// The token endpoint.
    pub fn token_endpoint(&self) -> String {
        self.url("/token")
    }

    /// Changes the knobs; the next request sees the change.
    pub fn knobs(&self, change: impl FnOnce(&mut Knobs)) {
        change(&mut lock(&self.shared).knobs);
    }

    /// Accepts JWT bearer assertions (RFC 7523) that `issuer` signs with `jwk`: a
    /// workload identity issuer, or an identity provider's ID-JAGs.
    pub fn trust_issuer(&self, issuer: &str, jwk: Value) {
        lock(&self.shared)
            .trusted_issuers
            .entry(issuer.into())
            .or_default()
            .push(jwk);
    }

    /// Pre-registers a client.
    pub fn register(&self, client: ClientSpec) {
        lock(&self.shared)
            .clients
            .insert(client.client_id.clone(), client);
    }

    /// A client as registered (pre-registered or dynamic), by id.
    pub fn client(&self, client_id: &str) -> Option<ClientSpec> {
        lock(&self.shared).clients.get(client_id).cloned()
    }

    /// Every client registered so far.
    pub fn clients(&self) -> Vec<ClientSpec> {
        lock(&self.shared).clients.values().cloned().collect()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        lock(&self.shared).counters.clone()
    }

    /// Every request the protected resources received, in order.
    pub fn hits(&self) -> Vec<ResourceHit> {
        lock(&self.shared).hits.clone()
    }

    /// The requests that one resource (by URI) received.
    pub fn hits_on(&self, resource: &str) -> Vec<ResourceHit> {
        self.hits()
            .into_iter()
            .filter(|hit| hit.resource == resource)
            .collect()
    }

    /// What the server knows of an access token it issued.
    pub fn token(&self, access_token: &str) -> Option<IssuedToken> {
        lock(&self.shared).access.get(access_token).cloned()
    }

    /// Every access token issued so far.
    pub fn access_tokens(&self) -> Vec<String> {
        lock(&self.shared).access.keys().cloned().collect()
    }

    /// New DPoP nonces: the next proof with an old one is answered `use_dpop_nonce`.
    pub fn rotate_dpop_nonces(&self) {
        let mut state = lock(&self.shared);
        state.dpop_nonce_as = format!("as-{}", random_token(9));
        state.dpop_nonce_rs = format!("rs-{}", random_token(9));
    }

    /// Makes every access token issued so far expire now (the next call meets a 401).
    pub fn expire_access_tokens(&self) {
        let now = Instant::now();
        for token in lock(&self.shared).access.values_mut() {
            token.expires = now;
        }
    }

    /// Starts a protected resource at `http://127.0.0.1:PORT{path}` that accepts this
    /// server's tokens bound to it and passes accepted requests to `inner` (e.g.
    /// [`mcp_handler`](crate::mcp_handler)). `scopes` go in its metadata and its 401
    /// challenge.
    pub async fn protect(
        &self,
        path: &str,
        scopes: &[&str],
        inner: impl Fn(&HttpRequest) -> HttpReply + Send + Sync + 'static,
    ) -> ProtectedResource {
        let shared = self.shared.clone();
        let config = Arc::new(Mutex::new(ResourceConfig {
            path: path.to_string(),
            resource: String::new(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }));
        let handler_config = config.clone();
        let server = TestServer::start(move |request| {
            let config = handler_config
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone();
            protected_resource(&shared, &config, &inner, request)
        })
        .await;
        let resource = server.url(path);
        config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .resource = resource.clone();
        ProtectedResource {
            metadata_url: server.url(&format!("/.well-known/oauth-protected-resource{path}")),
            resource,
            server,
        }
    }
}

/// A resource behind bearer-token checks against an [`AuthServer`]; it stops when dropped.
pub struct ProtectedResource {
    /// The HTTP server.
    pub server: TestServer,
    /// Its URI: the RFC 8707 resource identifier and the URL to call.
    pub resource: String,
    /// Its RFC 9728 metadata document (the path-suffixed well-known URL).
    pub metadata_url: String,
}

/// The PKCE S256 challenge of a verifier (RFC 7636 section 4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

pub(crate) fn json_reply(status: u16, body: Value) -> HttpReply {
    HttpReply::json(status, &body).with_header("cache-control", "no-store")
}

fn query_of(target: &str) -> HashMap<String, String> {
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

fn path_of(target: &str) -> &str {
    target.split_once('?').map(|(p, _)| p).unwrap_or(target)
}

pub(crate) fn scopes_of(text: Option<&String>) -> Vec<String> {
    text.map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

fn authorization_server(shared: &Shared, request: &HttpRequest) -> HttpReply {
    let mut state = lock(shared);
    let path = path_of(&request.target).to_string();
    match (request.method.as_str(), path.as_str()) {
        ("GET", "/.well-known/oauth-authorization-server") if state.knobs.serve_oauth_metadata => {
            metadata(&mut state, &path)
        }
        ("GET", "/.well-known/openid-configuration") if state.knobs.serve_openid_metadata => {
            metadata(&mut state, &path)
        }
        ("POST", "/register") if state.knobs.registration_enabled => {
            registration(&mut state, request)
        }
        // OpenID discovery names a key set; this server signs nothing, so it is empty.
        ("GET", "/jwks") => json_reply(200, json!({"keys": []})),
        ("GET", "/authorize") => authorization(&mut state, request),
        ("POST", "/token") => token(&mut state, request),
        _ => HttpReply::text(404, "not found"),
    }
}

fn metadata(state: &mut State, path: &str) -> HttpReply {
    *state
        .counters
        .metadata_requests
        .entry(path.to_string())
        .or_default() += 1;
    let issuer = state.issuer.clone();
    let knobs = &state.knobs;
    let mut document = json!({
        "issuer": knobs.metadata_issuer.clone().unwrap_or_else(|| issuer.clone()),
        "authorization_endpoint": knobs.authorization_endpoint.clone()
            .unwrap_or_else(|| format!("{issuer}/authorize")),
        "token_endpoint": knobs.token_endpoint.clone()
            .unwrap_or_else(|| format!("{issuer}/token")),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "client_credentials", "refresh_token",
            jwt_grant::JWT_BEARER_GRANT],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported":
            ["none", "client_secret_basic", "client_secret_post", "private_key_jwt"],
        "token_endpoint_auth_signing_alg_values_supported": ["RS256", "ES256"],
        "scopes_supported": knobs.scopes_supported,
        "authorization_response_iss_parameter_supported": true,
    });
    if knobs.registration_enabled {
        document["registration_endpoint"] = json!(format!("{issuer}/register"));
    }
    if knobs.dpop {
        document["dpop_signing_alg_values_supported"] = json!(["ES256"]);
    }
    if path.contains("openid") {
        document["subject_types_supported"] = json!(["public"]);
        document["id_token_signing_alg_values_supported"] = json!(["RS256"]);
        document["jwks_uri"] = json!(format!("{issuer}/jwks"));
    }
    json_reply(200, document)
}

pub(crate) fn oauth_error(
    state: &mut State,
    status: u16,
    error: &str,
    description: &str,
) -> HttpReply {
    state
        .counters
        .errors
        .push(format!("{error}: {description}"));
    json_reply(
        status,
        json!({"error": error, "error_description": description}),
    )
}
