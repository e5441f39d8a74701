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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use crate::jwt::{JWT_BEARER_ASSERTION, SigningKey, random_token, unix_now, verify_jwt};
use crate::server::{HttpRequest, Reply, TestServer};

mod dpop;
pub(crate) mod jwt_grant;

/// How a client authenticates at the token endpoint (RFC 7591 `token_endpoint_auth_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// A public client: `client_id` in the body, no secret (authorization code + PKCE only).
    None,
    /// HTTP Basic with the form-encoded id and secret.
    SecretBasic,
    /// `client_id` and `client_secret` in the body.
    SecretPost,
    /// A JWT signed with the client's registered key (RS256 or ES256).
    PrivateKeyJwt,
}

impl AuthMethod {
    /// The RFC 7591 name.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::SecretBasic => "client_secret_basic",
            Self::SecretPost => "client_secret_post",
            Self::PrivateKeyJwt => "private_key_jwt",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [
            Self::None,
            Self::SecretBasic,
            Self::SecretPost,
            Self::PrivateKeyJwt,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// A client known to the server: pre-registered with [`AuthServer::register`] or created
/// by dynamic registration.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// The client id.
    pub client_id: String,
    /// The secret, for the two secret methods.
    pub secret: Option<String>,
    /// The one method this client may use at the token endpoint.
    pub auth_method: AuthMethod,
    /// Redirect URIs; a loopback one matches any port (RFC 8252 section 7.3).
    pub redirect_uris: Vec<String>,
    /// Public keys (JWKs) for `private_key_jwt`.
    pub jwks: Vec<Value>,
}

impl ClientSpec {
    /// A confidential client authenticating with HTTP Basic.
    pub fn secret_basic(client_id: &str, secret: &str) -> Self {
        Self::with(client_id, Some(secret), AuthMethod::SecretBasic)
    }

    /// A confidential client sending its secret in the body.
    pub fn secret_post(client_id: &str, secret: &str) -> Self {
        Self::with(client_id, Some(secret), AuthMethod::SecretPost)
    }

    /// A client authenticating with assertions signed by `key`.
    pub fn private_key_jwt(client_id: &str, key: &SigningKey) -> Self {
        let mut spec = Self::with(client_id, None, AuthMethod::PrivateKeyJwt);
        spec.jwks = vec![key.public_jwk()];
        spec
    }

    /// A public client for authorization code + PKCE.
    pub fn public(client_id: &str, redirect_uris: &[&str]) -> Self {
        let mut spec = Self::with(client_id, None, AuthMethod::None);
        spec.redirect_uris = redirect_uris.iter().map(|s| s.to_string()).collect();
        spec
    }

    /// Adds redirect URIs.
    pub fn redirecting_to(mut self, redirect_uris: &[&str]) -> Self {
        self.redirect_uris
            .extend(redirect_uris.iter().map(|s| s.to_string()));
        self
    }

    fn with(client_id: &str, secret: Option<&str>, auth_method: AuthMethod) -> Self {
        Self {
            client_id: client_id.into(),
            secret: secret.map(str::to_string),
            auth_method,
            redirect_uris: Vec::new(),
            jwks: Vec::new(),
        }
    }
}

/// Ways to make the server misbehave, or behave differently; change them at any time with
/// [`AuthServer::knobs`].
#[derive(Debug, Clone)]
pub struct Knobs {
    /// Lifetime of access tokens (`expires_in`); short for refresh tests.
    pub access_ttl: Duration,
    /// Refresh tokens rotate: each use answers a new one and the old one dies (reuse is
    /// detected and revokes the whole family). Off: a refresh token stays valid.
    pub rotate_refresh_tokens: bool,
    /// Client credentials grants also answer a refresh token.
    pub refresh_for_client_credentials: bool,
    /// Every access token starts with this (a sigil for leak scans).
    pub access_token_prefix: String,
    /// Every refresh token starts with this.
    pub refresh_token_prefix: String,
    /// Scopes in `scopes_supported` of the AS metadata.
    pub scopes_supported: Vec<String>,
    /// The `issuer` the metadata documents claim (a wrong one for RFC 8414 section 3.3).
    pub metadata_issuer: Option<String>,
    /// The `token_endpoint` the metadata names instead of the real one.
    pub token_endpoint: Option<String>,
    /// The `authorization_endpoint` the metadata names instead of the real one.
    pub authorization_endpoint: Option<String>,
    /// The `authorization_servers` the protected resource metadata names instead of this
    /// server (e.g. a private address).
    pub authorization_servers: Option<Vec<String>>,
    /// The `iss` the authorization response carries instead of the issuer (RFC 9207).
    pub response_iss: Option<String>,
    /// The authorization response carries no `iss` at all.
    pub omit_response_iss: bool,
    /// Serve `/.well-known/oauth-authorization-server` (RFC 8414).
    pub serve_oauth_metadata: bool,
    /// Serve `/.well-known/openid-configuration`.
    pub serve_openid_metadata: bool,
    /// Offer and accept dynamic client registration (RFC 7591).
    pub registration_enabled: bool,
    /// Protected resources answer 403 `insufficient_scope` to a token without this scope,
    /// naming it in the challenge (step-up).
    pub required_scope: Option<String>,
    /// The token endpoint holds each refresh grant's answer this long (decided, not yet
    /// sent): refreshes from clients that do not wait for each other overlap for sure.
    pub refresh_delay: Duration,
    /// Scopes the server never grants, whatever is asked: with `required_scope` among
    /// them, a resource keeps answering 403 however often the client steps up.
    pub withheld_scopes: Vec<String>,
    /// DPoP (RFC 9449): the metadata offers ES256 proofs, a token request with a valid
    /// proof gets a token bound to its key (`token_type` DPoP), and resources take a bound
    /// token only with the DPoP scheme and a valid proof of that key.
    pub dpop: bool,
    /// With `dpop`: a token request without a proof is refused.
    pub dpop_required: bool,
    /// With `dpop`: the token endpoint and the resources each demand their own current
    /// nonce (`use_dpop_nonce`); [`AuthServer::rotate_dpop_nonces`] changes them.
    pub dpop_nonces: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            access_ttl: Duration::from_secs(3600),
            rotate_refresh_tokens: true,
            refresh_for_client_credentials: false,
            access_token_prefix: "at-".into(),
            refresh_token_prefix: "rt-".into(),
            scopes_supported: vec![
                "mcp:read".into(),
                "mcp:write".into(),
                "offline_access".into(),
            ],
            metadata_issuer: None,
            token_endpoint: None,
            authorization_endpoint: None,
            authorization_servers: None,
            response_iss: None,
            omit_response_iss: false,
            serve_oauth_metadata: true,
            serve_openid_metadata: true,
            registration_enabled: true,
            required_scope: None,
            refresh_delay: Duration::ZERO,
            withheld_scopes: Vec::new(),
            dpop: false,
            dpop_required: false,
            dpop_nonces: false,
        }
    }
}

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
    expires: Instant,
}

impl IssuedToken {
    /// Whether it is past its lifetime.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.expires
    }
}

#[derive(Debug)]
struct RefreshToken {
    client_id: String,
    audience: Option<String>,
    scopes: Vec<String>,
    family: u64,
    used: bool,
    /// A token bound to a DPoP key is refreshed only with a proof of that key.
    jkt: Option<String>,
}

#[derive(Debug)]
struct Code {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    resource: Option<String>,
    scopes: Vec<String>,
}

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
        inner: impl Fn(&HttpRequest) -> Reply + Send + Sync + 'static,
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

#[derive(Debug, Clone)]
struct ResourceConfig {
    path: String,
    resource: String,
    scopes: Vec<String>,
}

/// The PKCE S256 challenge of a verifier (RFC 7636 section 4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

pub(crate) fn json_reply(status: u16, body: Value) -> Reply {
    Reply::typed(status, "application/json", body.to_string())
        .with_header("cache-control", "no-store")
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

fn authorization_server(shared: &Shared, request: &HttpRequest) -> Reply {
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
        _ => Reply::text(404, "not found"),
    }
}

fn metadata(state: &mut State, path: &str) -> Reply {
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

pub(crate) fn oauth_error(state: &mut State, status: u16, error: &str, description: &str) -> Reply {
    state
        .counters
        .errors
        .push(format!("{error}: {description}"));
    json_reply(
        status,
        json!({"error": error, "error_description": description}),
    )
}

fn registration(state: &mut State, request: &HttpRequest) -> Reply {
    let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
        return oauth_error(
            state,
            400,
            "invalid_client_metadata",
            "the body is not JSON",
        );
    };
    let method_name = body["token_endpoint_auth_method"]
        .as_str()
        .unwrap_or("client_secret_basic");
    let Some(method) = AuthMethod::parse(method_name) else {
        return oauth_error(
            state,
            400,
            "invalid_client_metadata",
            &format!("unsupported token_endpoint_auth_method {method_name}"),
        );
    };
    let redirect_uris: Vec<String> = body["redirect_uris"]
        .as_array()
        .map(|uris| {
            uris.iter()
                .filter_map(|u| u.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let grant_types = body
        .get("grant_types")
        .cloned()
        .unwrap_or_else(|| json!(["authorization_code"]));
    let wants_code = grant_types
        .as_array()
        .is_some_and(|g| g.iter().any(|g| g == "authorization_code"));
    if wants_code && redirect_uris.is_empty() {
        return oauth_error(
            state,
            400,
            "invalid_redirect_uri",
            "authorization_code needs redirect_uris",
        );
    }
    let jwks: Vec<Value> = body["jwks"]["keys"].as_array().cloned().unwrap_or_default();
    if method == AuthMethod::PrivateKeyJwt && jwks.is_empty() {
        return oauth_error(
            state,
            400,
            "invalid_client_metadata",
            "private_key_jwt needs jwks (jwks_uri is not supported here)",
        );
    }
    let client_id = format!("dyn-{}", random_token(9));
    let secret = matches!(method, AuthMethod::SecretBasic | AuthMethod::SecretPost)
        .then(|| random_token(24));
    let mut answer = body.clone();
    answer["client_id"] = json!(client_id);
    answer["client_id_issued_at"] = json!(unix_now());
    answer["token_endpoint_auth_method"] = json!(method.name());
    answer["grant_types"] = grant_types;
    if let Some(secret) = &secret {
        answer["client_secret"] = json!(secret);
        answer["client_secret_expires_at"] = json!(0);
    }
    state.clients.insert(
        client_id.clone(),
        ClientSpec {
            client_id,
            secret,
            auth_method: method,
            redirect_uris,
            jwks,
        },
    );
    state.counters.registrations += 1;
    json_reply(201, answer)
}

/// RFC 8252 section 7.3: a loopback redirect URI matches whatever port the client listens
/// on; any other must match exactly.
fn redirect_matches(registered: &str, presented: &str) -> bool {
    if registered == presented {
        return true;
    }
    let (Ok(a), Ok(b)) = (url::Url::parse(registered), url::Url::parse(presented)) else {
        return false;
    };
    let loopback = |u: &url::Url| matches!(u.host_str(), Some("127.0.0.1" | "[::1]" | "localhost"));
    loopback(&a)
        && a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.path() == b.path()
        && a.query() == b.query()
}

fn authorization(state: &mut State, request: &HttpRequest) -> Reply {
    let query = query_of(&request.target);
    let get = |name: &str| query.get(name).cloned().unwrap_or_default();
    let client_id = get("client_id");
    let redirect_uri = get("redirect_uri");
    // Errors before the redirect URI is trusted are shown here, never redirected.
    let Some(client) = state.clients.get(&client_id).cloned() else {
        return oauth_error(
            state,
            400,
            "invalid_client",
            &format!("unknown client_id {client_id:?}"),
        );
    };
    if !client
        .redirect_uris
        .iter()
        .any(|r| redirect_matches(r, &redirect_uri))
    {
        return oauth_error(
            state,
            400,
            "invalid_request",
            &format!("redirect_uri {redirect_uri:?} is not registered"),
        );
    }
    let iss = if state.knobs.omit_response_iss {
        None
    } else {
        Some(
            state
                .knobs
                .response_iss
                .clone()
                .unwrap_or_else(|| state.issuer.clone()),
        )
    };
    let redirect = |params: Vec<(&str, String)>| {
        let mut url = match url::Url::parse(&redirect_uri) {
            Ok(url) => url,
            Err(_) => return Reply::text(400, "the redirect_uri does not parse"),
        };
        {
            let mut pairs = url.query_pairs_mut();
            for (name, value) in params {
                pairs.append_pair(name, &value);
            }
            if let Some(state_param) = query.get("state") {
                pairs.append_pair("state", state_param);
            }
            if let Some(iss) = &iss {
                pairs.append_pair("iss", iss);
            }
        }
        Reply::Respond {
            status: 302,
            headers: vec![("location".into(), url.to_string())],
            body: Vec::new(),
        }
    };
    let refuse = |state: &mut State, error: &str, description: &str| {
        state
            .counters
            .errors
            .push(format!("{error}: {description}"));
        redirect(vec![
            ("error", error.to_string()),
            ("error_description", description.to_string()),
        ])
    };
    if get("response_type") != "code" {
        return refuse(
            state,
            "unsupported_response_type",
            "response_type must be code",
        );
    }
    // OAuth 2.1: PKCE is required, and only S256 is offered.
    if get("code_challenge").is_empty() || get("code_challenge_method") != "S256" {
        return refuse(
            state,
            "invalid_request",
            "code_challenge with code_challenge_method S256 is required",
        );
    }
    let code = random_token(18);
    state.codes.insert(
        code.clone(),
        Code {
            client_id,
            redirect_uri: redirect_uri.clone(),
            challenge: get("code_challenge"),
            resource: query.get("resource").cloned(),
            scopes: scopes_of(query.get("scope")),
        },
    );
    state.counters.authorizations += 1;
    redirect(vec![("code", code)])
}

/// Who the token request authenticated as, or the refusal to answer.
fn authenticate(
    state: &mut State,
    request: &HttpRequest,
    form: &HashMap<String, String>,
) -> Result<ClientSpec, Reply> {
    let basic = request
        .header("authorization")
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|encoded| STANDARD.decode(encoded.trim()).ok())
        .map(|decoded| String::from_utf8_lossy(&decoded).into_owned());
    let (method, client_id, secret) = if let Some(pair) = basic {
        let (id, secret) = pair.split_once(':').unwrap_or((&pair, ""));
        // RFC 6749 section 2.3.1: both halves are form-encoded before joining.
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        (AuthMethod::SecretBasic, decode(id), Some(decode(secret)))
    } else if let Some(assertion) = form.get("client_assertion") {
        if form.get("client_assertion_type").map(String::as_str) != Some(JWT_BEARER_ASSERTION) {
            return Err(oauth_error(
                state,
                400,
                "invalid_client",
                "client_assertion_type must be the jwt-bearer URN",
            ));
        }
        return authenticate_assertion(state, assertion, form.get("client_id"));
    } else if let Some(secret) = form.get("client_secret") {
        (
            AuthMethod::SecretPost,
            form.get("client_id").cloned().unwrap_or_default(),
            Some(secret.clone()),
        )
    } else {
        (
            AuthMethod::None,
            form.get("client_id").cloned().unwrap_or_default(),
            None,
        )
    };
    *state
        .counters
        .auth_methods
        .entry(method.name().into())
        .or_default() += 1;
    let Some(client) = state.clients.get(&client_id).cloned() else {
        return Err(oauth_error(
            state,
            401,
            "invalid_client",
            &format!("unknown client_id {client_id:?}"),
        ));
    };
    if client.auth_method != method {
        return Err(oauth_error(
            state,
            401,
            "invalid_client",
            &format!(
                "this client is registered for {} but used {}",
                client.auth_method.name(),
                method.name()
            ),
        ));
    }
    if client.secret.is_some() && client.secret != secret {
        return Err(oauth_error(
            state,
            401,
            "invalid_client",
            "wrong client secret",
        ));
    }
    Ok(client)
}

fn authenticate_assertion(
    state: &mut State,
    assertion: &str,
    form_client_id: Option<&String>,
) -> Result<ClientSpec, Reply> {
    *state
        .counters
        .auth_methods
        .entry(AuthMethod::PrivateKeyJwt.name().into())
        .or_default() += 1;
    // The client is named by the assertion's `sub`, read before the signature is checked
    // only to pick the keys to check it with.
    let unverified_sub = assertion
        .split('.')
        .nth(1)
        .and_then(|part| URL_SAFE_NO_PAD.decode(part).ok())
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .and_then(|claims| claims["sub"].as_str().map(str::to_string))
        .unwrap_or_default();
    let client = match state.clients.get(&unverified_sub) {
        Some(client) if client.auth_method == AuthMethod::PrivateKeyJwt => client.clone(),
        _ => {
            return Err(oauth_error(
                state,
                401,
                "invalid_client",
                &format!("no private_key_jwt client {unverified_sub:?}"),
            ));
        }
    };
    let claims = match verify_jwt(assertion, &client.jwks) {
        Ok(claims) => claims,
        Err(why) => return Err(oauth_error(state, 401, "invalid_client", &why)),
    };
    let issuer = state.issuer.clone();
    let audiences: Vec<String> = match &claims["aud"] {
        Value::String(one) => vec![one.clone()],
        Value::Array(many) => many
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    let audience_ok = audiences
        .iter()
        .any(|a| a == &issuer || a == &format!("{issuer}/token") || a == &format!("{issuer}/"));
    let jti = claims["jti"].as_str().unwrap_or_default().to_string();
    let problem = if claims["iss"].as_str() != Some(client.client_id.as_str()) {
        Some("the assertion's iss is not the client id")
    } else if form_client_id.is_some_and(|id| id != &client.client_id) {
        Some("client_id and the assertion's sub differ")
    } else if !audience_ok {
        Some("the assertion's aud is neither the issuer nor the token endpoint")
    } else if claims["exp"].as_u64().is_none_or(|exp| exp <= unix_now()) {
        Some("the assertion has expired or has no exp")
    } else if jti.is_empty() || !state.assertion_ids.insert(jti) {
        Some("the assertion's jti is missing or was used before")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(oauth_error(state, 401, "invalid_client", problem)),
        None => Ok(client),
    }
}

fn token(state: &mut State, request: &HttpRequest) -> Reply {
    let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
        .into_owned()
        .collect();
    let grant = form.get("grant_type").cloned().unwrap_or_default();
    *state
        .counters
        .token_requests
        .entry(grant.clone())
        .or_default() += 1;
    let client = match authenticate(state, request, &form) {
        Ok(client) => client,
        Err(refusal) => return refusal,
    };
    state.issuing_jkt = match dpop::token_request_proof(state, request) {
        Ok(jkt) => jkt,
        Err(refusal) => return refusal,
    };
    let resource = form.get("resource").cloned();
    match grant.as_str() {
        "client_credentials" => {
            if client.auth_method == AuthMethod::None {
                return oauth_error(
                    state,
                    400,
                    "unauthorized_client",
                    "a public client cannot use client_credentials",
                );
            }
            let scopes = scopes_of(form.get("scope"));
            let with_refresh = state.knobs.refresh_for_client_credentials;
            issue(
                state,
                &grant,
                &client.client_id,
                resource,
                scopes,
                with_refresh,
                None,
            )
        }
        "authorization_code" => {
            let code = form.get("code").cloned().unwrap_or_default();
            // A code is single-use: it is gone whatever the outcome.
            let Some(granted) = state.codes.remove(&code) else {
                return oauth_error(state, 400, "invalid_grant", "unknown or used code");
            };
            let verifier = form.get("code_verifier").cloned().unwrap_or_default();
            let problem = if granted.client_id != client.client_id {
                Some(("invalid_grant", "the code was issued to another client"))
            } else if form.get("redirect_uri") != Some(&granted.redirect_uri) {
                Some((
                    "invalid_grant",
                    "redirect_uri differs from the authorization request",
                ))
            } else if pkce_challenge(&verifier) != granted.challenge {
                Some((
                    "invalid_grant",
                    "the code_verifier does not match the code_challenge",
                ))
            } else if resource.is_some()
                && granted.resource.is_some()
                && resource != granted.resource
            {
                Some((
                    "invalid_target",
                    "resource differs from the authorization request",
                ))
            } else {
                None
            };
            if let Some((error, description)) = problem {
                return oauth_error(state, 400, error, description);
            }
            let audience = resource.or(granted.resource);
            issue(
                state,
                &grant,
                &client.client_id,
                audience,
                granted.scopes,
                true,
                None,
            )
        }
        "refresh_token" => {
            let presented = form.get("refresh_token").cloned().unwrap_or_default();
            let Some(record) = state.refresh.get(&presented) else {
                return oauth_error(state, 400, "invalid_grant", "unknown refresh token");
            };
            let (owner, audience, scopes, family, used) = (
                record.client_id.clone(),
                record.audience.clone(),
                record.scopes.clone(),
                record.family,
                record.used,
            );
            if owner != client.client_id {
                return oauth_error(
                    state,
                    400,
                    "invalid_grant",
                    "the refresh token was issued to another client",
                );
            }
            let bound_to = state.refresh.get(&presented).and_then(|r| r.jkt.clone());
            if bound_to.is_some() && bound_to != state.issuing_jkt {
                return oauth_error(
                    state,
                    400,
                    "invalid_grant",
                    "the refresh token is bound to another DPoP key (RFC 9449 section 5)",
                );
            }
            if used {
                // RFC 9700 section 4.14.2: a rotated-out token presented again means two
                // holders; the whole family is revoked.
                state.counters.refresh_reuse += 1;
                state.revoked_families.insert(family);
                return oauth_error(
                    state,
                    400,
                    "invalid_grant",
                    "refresh token reuse detected; the token family is revoked",
                );
            }
            if state.revoked_families.contains(&family) {
                return oauth_error(state, 400, "invalid_grant", "the token family is revoked");
            }
            if resource.is_some() && resource != audience {
                return oauth_error(
                    state,
                    400,
                    "invalid_target",
                    "resource differs from the original grant",
                );
            }
            let asked = scopes_of(form.get("scope"));
            if asked.iter().any(|s| !scopes.contains(s)) {
                return oauth_error(
                    state,
                    400,
                    "invalid_scope",
                    "a refresh cannot widen the scope",
                );
            }
            let scopes = if asked.is_empty() { scopes } else { asked };
            let rotate = state.knobs.rotate_refresh_tokens;
            if rotate && let Some(record) = state.refresh.get_mut(&presented) {
                record.used = true;
            }
            state.counters.refreshes += 1;
            let keep = (!rotate).then_some(presented);
            let answer = issue(
                state,
                &grant,
                &client.client_id,
                audience,
                scopes,
                true,
                Some((family, keep)),
            );
            match state.knobs.refresh_delay {
                Duration::ZERO => answer,
                delay => Reply::Delayed(delay, Box::new(answer)),
            }
        }
        jwt_grant::JWT_BEARER_GRANT => jwt_grant::jwt_bearer(state, &client.client_id, &form),
        _ => oauth_error(
            state,
            400,
            "unsupported_grant_type",
            &format!("grant_type {grant:?} is not supported"),
        ),
    }
}

/// Issues an access token (and a refresh token when `with_refresh`). `family` carries a
/// refresh's family and, without rotation, the refresh token to answer again.
pub(crate) fn issue(
    state: &mut State,
    grant: &str,
    client_id: &str,
    audience: Option<String>,
    scopes: Vec<String>,
    with_refresh: bool,
    family: Option<(u64, Option<String>)>,
) -> Reply {
    let knobs = &state.knobs;
    let scopes: Vec<String> = scopes
        .into_iter()
        .filter(|s| !knobs.withheld_scopes.contains(s))
        .collect();
    let access_token = format!("{}{}", knobs.access_token_prefix, random_token(24));
    let ttl = knobs.access_ttl;
    let jkt = state.issuing_jkt.take();
    state.access.insert(
        access_token.clone(),
        IssuedToken {
            client_id: client_id.into(),
            audience: audience.clone(),
            scopes: scopes.clone(),
            grant: grant.into(),
            jkt: jkt.clone(),
            expires: Instant::now() + ttl,
        },
    );
    *state
        .counters
        .tokens_issued
        .entry(grant.into())
        .or_default() += 1;
    let mut answer = json!({
        "access_token": access_token,
        "token_type": if jkt.is_some() { "DPoP" } else { "Bearer" },
        "expires_in": ttl.as_secs(),
    });
    if !scopes.is_empty() {
        answer["scope"] = json!(scopes.join(" "));
    }
    if with_refresh {
        let refresh_token = match family {
            Some((_, Some(kept))) => kept,
            _ => {
                let family = match family {
                    Some((family, _)) => family,
                    None => {
                        state.next_family += 1;
                        state.next_family
                    }
                };
                let token = format!("{}{}", state.knobs.refresh_token_prefix, random_token(24));
                state.refresh.insert(
                    token.clone(),
                    RefreshToken {
                        client_id: client_id.into(),
                        audience,
                        scopes,
                        family,
                        used: false,
                        jkt,
                    },
                );
                token
            }
        };
        answer["refresh_token"] = json!(refresh_token);
    }
    json_reply(200, answer)
}

fn protected_resource(
    shared: &Shared,
    config: &ResourceConfig,
    inner: &(impl Fn(&HttpRequest) -> Reply + Send + Sync),
    request: &HttpRequest,
) -> Reply {
    let path = path_of(&request.target);
    let metadata_path = format!("/.well-known/oauth-protected-resource{}", config.path);
    let metadata_url = format!(
        "{}{metadata_path}",
        config
            .resource
            .strip_suffix(&config.path)
            .unwrap_or_default()
    );
    let mut state = lock(shared);
    if request.method == "GET"
        && (path == metadata_path || path == "/.well-known/oauth-protected-resource")
    {
        *state
            .counters
            .metadata_requests
            .entry(path.to_string())
            .or_default() += 1;
        let servers = state
            .knobs
            .authorization_servers
            .clone()
            .unwrap_or_else(|| vec![state.issuer.clone()]);
        return json_reply(
            200,
            json!({
                "resource": config.resource,
                "authorization_servers": servers,
                "scopes_supported": config.scopes,
                "bearer_methods_supported": ["header"],
            }),
        );
    }
    let (scheme, bearer) = match request
        .header("authorization")
        .and_then(|v| v.split_once(' '))
    {
        Some((scheme, token))
            if ["bearer", "dpop"].contains(&scheme.to_ascii_lowercase().as_str()) =>
        {
            (Some(scheme.to_string()), Some(token.trim().to_string()))
        }
        _ => (None, None),
    };
    let scope = config.scopes.join(" ");
    // A DPoP server challenges with the DPoP scheme (RFC 9449 section 7.1).
    let challenge_scheme = if state.knobs.dpop { "DPoP" } else { "Bearer" };
    let challenge = |error: Option<&str>, scope: &str| {
        let mut value = format!("{challenge_scheme} resource_metadata=\"{metadata_url}\"");
        if !scope.is_empty() {
            value.push_str(&format!(", scope=\"{scope}\""));
        }
        if let Some(error) = error {
            value.push_str(&format!(", error=\"{error}\""));
        }
        value
    };
    let issued = bearer.as_ref().and_then(|b| state.access.get(b)).cloned();
    let dpop = request.header("dpop").map(|proof| {
        dpop::check(
            Some(proof),
            &request.method,
            &config.resource,
            bearer.as_deref(),
            &mut state.dpop_jtis,
        )
    });
    let dpop_seen = dpop
        .as_ref()
        .map(|d| d.as_ref().map(|p| p.jkt.clone()).map_err(Clone::clone));
    let record = |state: &mut State, status: u16| {
        state.hits.push(ResourceHit {
            resource: config.resource.clone(),
            method: format!("{} {}", request.method, request.target),
            bearer: bearer.clone(),
            scheme: scheme.clone(),
            dpop: dpop_seen.clone(),
            status,
        });
    };
    if let Some(reply) = dpop::resource_proof_refusal(
        &mut state,
        issued.as_ref(),
        scheme.as_deref(),
        dpop.as_ref(),
        &challenge(Some("invalid_dpop_proof"), &scope),
    ) {
        record(&mut state, status_of(&reply));
        return reply;
    }
    let refusal = match (&bearer, &issued) {
        (None, _) => Some(challenge(None, &scope)),
        (Some(_), None) => Some(challenge(Some("invalid_token"), &scope)),
        (Some(_), Some(token)) if token.expired() => Some(challenge(Some("invalid_token"), &scope)),
        // RFC 8707: a token bound to another resource (or to none) is refused here.
        (Some(_), Some(token)) if token.audience.as_deref() != Some(config.resource.as_str()) => {
            Some(challenge(Some("invalid_token"), &scope))
        }
        _ => None,
    };
    if let Some(value) = refusal {
        record(&mut state, 401);
        return json_reply(401, json!({"error": "invalid_token"}))
            .with_header("www-authenticate", &value);
    }
    if let (Some(required), Some(token)) = (state.knobs.required_scope.clone(), &issued)
        && !token.scopes.contains(&required)
    {
        let mut wanted = config.scopes.clone();
        if !wanted.contains(&required) {
            wanted.push(required);
        }
        record(&mut state, 403);
        return json_reply(403, json!({"error": "insufficient_scope"})).with_header(
            "www-authenticate",
            &challenge(Some("insufficient_scope"), &wanted.join(" ")),
        );
    }
    // The inner handler runs without the lock: it may be slow or stall.
    drop(state);
    let reply = inner(request);
    record(&mut lock(shared), status_of(&reply));
    reply
}

/// The status a reply will answer with; 0 for none.
fn status_of(reply: &Reply) -> u16 {
    match reply {
        Reply::Respond { status, .. } | Reply::Stream { status, .. } => *status,
        Reply::Delayed(_, inner) => status_of(inner),
        Reply::Stall | Reply::Reset => 0,
    }
}
