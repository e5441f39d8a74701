//! A real enterprise identity provider on 127.0.0.1 for enterprise-managed authorization
//! (cross-app access): it signs ID tokens for tests, and its token endpoint exchanges one
//! for an ID-JAG (RFC 8693 token exchange, `requested_token_type` id-jag) that an
//! [`AuthServer`](crate::AuthServer) trusting [`TestIdentityProvider::jag_jwk`] accepts in a
//! JWT bearer grant. Every exchange it received is kept, to assert on its form.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::jwt::{SigningKey, random_token, unix_now, verify_jwt};
use crate::oauth::json_reply;
use crate::oauth::jwt_grant::ID_JAG_TYP;
use crate::server::{HttpReply, HttpRequest, TestServer};

/// One token exchange the identity provider received.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The form, as sent.
    pub form: HashMap<String, String>,
    /// The client id of an HTTP Basic `authorization` header, if one came.
    pub basic_client: Option<String>,
    /// The status answered.
    pub status: u16,
    /// The ID-JAG issued, for a 200.
    pub issued: Option<String>,
}

struct Client {
    secret: Option<String>,
    /// The client the ID-JAG names (`client_id`): this application at the authorization
    /// server.
    app_client_id: String,
}

struct State {
    issuer: String,
    id_key: SigningKey,
    jag_key: SigningKey,
    clients: HashMap<String, Client>,
    exchanges: Vec<Exchange>,
    refusal: Option<(String, String)>,
    stall: bool,
}

/// The identity provider; it stops when dropped. Its issuer is its base URL.
pub struct TestIdentityProvider {
    /// The HTTP server.
    pub server: TestServer,
    shared: Arc<Mutex<State>>,
}

fn lock(shared: &Arc<Mutex<State>>) -> MutexGuard<'_, State> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl TestIdentityProvider {
    /// Starts one with fresh ES256 keys for ID tokens and for ID-JAGs.
    pub async fn start() -> Self {
        let shared = Arc::new(Mutex::new(State {
            issuer: String::new(),
            id_key: SigningKey::es256(),
            jag_key: SigningKey::es256(),
            clients: HashMap::new(),
            exchanges: Vec::new(),
            refusal: None,
            stall: false,
        }));
        let handler = shared.clone();
        let server = TestServer::start(move |request| token_endpoint(&handler, request)).await;
        lock(&shared).issuer = format!("http://{}", server.addr);
        Self { server, shared }
    }

    /// The issuer, `http://127.0.0.1:PORT`.
    pub fn issuer(&self) -> String {
        lock(&self.shared).issuer.clone()
    }

    /// The token endpoint, where ID tokens are exchanged.
    pub fn token_endpoint(&self) -> String {
        self.server.url("/token")
    }

    /// Registers a client of the identity provider (with a secret for HTTP Basic, or
    /// none for a public one) whose ID-JAGs name `app_client_id`.
    pub fn register(&self, client_id: &str, secret: Option<&str>, app_client_id: &str) {
        lock(&self.shared).clients.insert(
            client_id.into(),
            Client {
                secret: secret.map(str::to_string),
                app_client_id: app_client_id.into(),
            },
        );
    }

    /// An ID token for `subject`, issued to `client_id`, valid for an hour.
    pub fn id_token(&self, subject: &str, client_id: &str) -> String {
        let state = lock(&self.shared);
        let now = unix_now();
        state.id_key.sign_jwt(&json!({
            "iss": state.issuer, "sub": subject, "aud": client_id,
            "iat": now, "exp": now + 3600, "email": format!("{subject}@example.com"),
        }))
    }

    /// The public key ID-JAGs are signed with, for [`AuthServer::trust_issuer`](crate::AuthServer::trust_issuer).
    pub fn jag_jwk(&self) -> Value {
        lock(&self.shared).jag_key.public_jwk()
    }

    /// Every exchange received, in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        lock(&self.shared).exchanges.clone()
    }

    /// From now on every exchange is refused with `error` and `description` (HTTP 400);
    /// `None` serves again.
    pub fn refuse(&self, refusal: Option<(&str, &str)>) {
        lock(&self.shared).refusal = refusal.map(|(e, d)| (e.into(), d.into()));
    }

    /// From now on every exchange is held unanswered (the client's cancel must close it).
    pub fn stall(&self, stall: bool) {
        lock(&self.shared).stall = stall;
    }
}

fn token_endpoint(shared: &Arc<Mutex<State>>, request: &HttpRequest) -> HttpReply {
    if request.method != "POST" || !request.target.starts_with("/token") {
        return HttpReply::text(404, "not found");
    }
    let mut state = lock(shared);
    if state.stall {
        return HttpReply::Stall;
    }
    let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
        .into_owned()
        .collect();
    let basic = request
        .header("authorization")
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|encoded| STANDARD.decode(encoded.trim()).ok())
        .map(|decoded| String::from_utf8_lossy(&decoded).into_owned());
    let (basic_client, basic_secret) = match &basic {
        Some(pair) => {
            let (id, secret) = pair.split_once(':').unwrap_or((pair, ""));
            (Some(id.to_string()), Some(secret.to_string()))
        }
        None => (None, None),
    };
    let (status, answer, issued) = match exchange(&state, &form, &basic_client, &basic_secret) {
        Ok((jag, answer)) => (200, answer, Some(jag)),
        Err((error, description)) => (
            400,
            json!({"error": error, "error_description": description}),
            None,
        ),
    };
    state.exchanges.push(Exchange {
        form,
        basic_client,
        status,
        issued,
    });
    json_reply(status, answer)
}

/// The checks of an RFC 8693 exchange for an ID-JAG, then the ID-JAG and the answer.
fn exchange(
    state: &State,
    form: &HashMap<String, String>,
    basic_client: &Option<String>,
    basic_secret: &Option<String>,
) -> Result<(String, Value), (String, String)> {
    if let Some((error, description)) = &state.refusal {
        return Err((error.clone(), description.clone()));
    }
    let get = |name: &str| form.get(name).map(String::as_str).unwrap_or_default();
    let client_id = basic_client
        .clone()
        .unwrap_or_else(|| get("client_id").into());
    let Some(client) = state.clients.get(&client_id) else {
        return Err((
            "invalid_client".into(),
            format!("unknown client {client_id:?}"),
        ));
    };
    if client.secret.is_some() && &client.secret != basic_secret {
        return Err(("invalid_client".into(), "wrong client secret".into()));
    }
    let expected = [
        (
            "grant_type",
            "urn:ietf:params:oauth:grant-type:token-exchange",
        ),
        (
            "requested_token_type",
            "urn:ietf:params:oauth:token-type:id-jag",
        ),
        (
            "subject_token_type",
            "urn:ietf:params:oauth:token-type:id_token",
        ),
    ];
    for (name, value) in expected {
        if get(name) != value {
            return Err(("invalid_request".into(), format!("{name} must be {value}")));
        }
    }
    for name in ["audience", "resource", "subject_token"] {
        if get(name).is_empty() {
            return Err(("invalid_request".into(), format!("{name} is missing")));
        }
    }
    let claims = verify_jwt(get("subject_token"), &[state.id_key.public_jwk()])
        .map_err(|why| ("invalid_grant".to_string(), why))?;
    if claims["iss"].as_str() != Some(state.issuer.as_str())
        || claims["aud"].as_str() != Some(client_id.as_str())
        || claims["exp"].as_u64().is_none_or(|exp| exp <= unix_now())
    {
        return Err((
            "invalid_grant".into(),
            "the ID token is not this provider's, not for this client, or expired".into(),
        ));
    }
    let now = unix_now();
    let mut jag_claims = json!({
        "iss": state.issuer, "sub": claims["sub"], "aud": get("audience"),
        "client_id": client.app_client_id, "resource": get("resource"),
        "iat": now, "exp": now + 300, "jti": random_token(12),
    });
    if !get("scope").is_empty() {
        jag_claims["scope"] = json!(get("scope"));
    }
    let jag = state.jag_key.sign_jwt_typed(ID_JAG_TYP, &jag_claims);
    let answer = json!({
        "access_token": jag,
        "issued_token_type": "urn:ietf:params:oauth:token-type:id-jag",
        "token_type": "N_A",
        "expires_in": 300,
    });
    Ok((jag, answer))
}
