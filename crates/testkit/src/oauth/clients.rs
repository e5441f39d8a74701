//! The clients the server knows: how each authenticates, dynamic registration
//! (RFC 7591), redirect URIs, and the authentication of a token request (secrets in the
//! header or the body, `private_key_jwt` assertions).

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use super::{State, json_reply, oauth_error};
use crate::jwt::{JWT_BEARER_ASSERTION, SigningKey, random_token, unix_now, verify_jwt};
use crate::server::HttpReply;
use crate::server::HttpRequest;

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

/// A client known to the server: pre-registered with
/// [`AuthServer::register`](crate::AuthServer::register) or created by dynamic
/// registration.
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

pub(super) fn registration(state: &mut State, request: &HttpRequest) -> HttpReply {
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
pub(super) fn redirect_matches(registered: &str, presented: &str) -> bool {
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

/// Who the token request authenticated as, or the refusal to answer.
pub(super) fn authenticate(
    state: &mut State,
    request: &HttpRequest,
    form: &HashMap<String, String>,
) -> Result<ClientSpec, HttpReply> {
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

pub(super) fn authenticate_assertion(
    state: &mut State,
    assertion: &str,
    form_client_id: Option<&String>,
) -> Result<ClientSpec, HttpReply> {
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
