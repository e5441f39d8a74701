//! The protected resources: bearer (or DPoP-bound) tokens checked against the server's
//! issue before a request reaches the resource's own handler, and its RFC 9728 metadata.

use serde_json::json;

use super::{ResourceHit, Shared, State, dpop, json_reply, lock, path_of};
use crate::server::{HttpReply, HttpRequest};

#[derive(Debug, Clone)]
pub(super) struct ResourceConfig {
    pub(super) path: String,
    pub(super) resource: String,
    pub(super) scopes: Vec<String>,
}

impl ResourceConfig {
    /// The path of its RFC 9728 metadata document (the path-suffixed well-known path).
    fn metadata_path(&self) -> String {
        format!("/.well-known/oauth-protected-resource{}", self.path)
    }

    /// The URL of its metadata document, as its challenges name it.
    fn metadata_url(&self) -> String {
        let origin = self.resource.strip_suffix(&self.path).unwrap_or_default();
        format!("{origin}{}", self.metadata_path())
    }
}

/// A request to a protected resource: its metadata, or the token (and its DPoP proof)
/// checked before the request reaches the resource's own handler.
pub(super) fn protected_resource(
    shared: &Shared,
    config: &ResourceConfig,
    inner: &(impl Fn(&HttpRequest) -> HttpReply + Send + Sync),
    request: &HttpRequest,
) -> HttpReply {
    let path = path_of(&request.target);
    let metadata_path = config.metadata_path();
    let metadata_url = config.metadata_url();
    let mut state = lock(shared);
    if request.method == "GET"
        && (path == metadata_path || path == "/.well-known/oauth-protected-resource")
    {
        return resource_metadata(&mut state, config, path);
    }
    let (scheme, bearer) = presented_token(request);
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

/// The resource's RFC 9728 metadata document, naming the servers it trusts.
fn resource_metadata(state: &mut State, config: &ResourceConfig, path: &str) -> HttpReply {
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
    json_reply(
        200,
        json!({
            "resource": config.resource,
            "authorization_servers": servers,
            "scopes_supported": config.scopes,
            "bearer_methods_supported": ["header"],
        }),
    )
}

/// The scheme and the token of the request's Authorization header, when it is Bearer or
/// DPoP.
fn presented_token(request: &HttpRequest) -> (Option<String>, Option<String>) {
    match request
        .header("authorization")
        .and_then(|v| v.split_once(' '))
    {
        Some((scheme, token))
            if ["bearer", "dpop"].contains(&scheme.to_ascii_lowercase().as_str()) =>
        {
            (Some(scheme.to_string()), Some(token.trim().to_string()))
        }
        _ => (None, None),
    }
}

/// The status a reply will answer with; 0 for none.
pub(super) fn status_of(reply: &HttpReply) -> u16 {
    match reply {
        HttpReply::Respond { status, .. } | HttpReply::Stream { status, .. } => *status,
        HttpReply::Delayed(_, inner) => status_of(inner),
        HttpReply::Stall | HttpReply::Reset => 0,
    }
}
