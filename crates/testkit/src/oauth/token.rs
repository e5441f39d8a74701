//! The token endpoint: every grant it answers (client credentials, authorization code,
//! refresh with rotation and reuse detection, JWT bearer), and the issue of tokens.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    AuthMethod, ClientSpec, IssuedToken, State, authenticate, dpop, json_reply, jwt_grant,
    oauth_error, pkce_challenge, scopes_of,
};
use crate::jwt::random_token;
use crate::server::{HttpReply, HttpRequest};

#[derive(Debug)]
pub(super) struct RefreshToken {
    pub(super) client_id: String,
    pub(super) audience: Option<String>,
    pub(super) scopes: Vec<String>,
    pub(super) family: u64,
    pub(super) used: bool,
    /// A token bound to a DPoP key is refreshed only with a proof of that key.
    pub(super) jkt: Option<String>,
}

/// The token endpoint: authenticates the client, checks a DPoP proof, then answers the
/// grant the form names.
pub(super) fn token(state: &mut State, request: &HttpRequest) -> HttpReply {
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
        "client_credentials" => client_credentials(state, &client, &form, resource),
        "authorization_code" => authorization_code(state, &client, &form, resource),
        "refresh_token" => refresh(state, &client, &form, resource),
        jwt_grant::JWT_BEARER_GRANT => jwt_grant::jwt_bearer(state, &client.client_id, &form),
        _ => oauth_error(
            state,
            400,
            "unsupported_grant_type",
            &format!("grant_type {grant:?} is not supported"),
        ),
    }
}

/// The client credentials grant: confidential clients only.
fn client_credentials(
    state: &mut State,
    client: &ClientSpec,
    form: &HashMap<String, String>,
    resource: Option<String>,
) -> HttpReply {
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
        "client_credentials",
        &client.client_id,
        resource,
        scopes,
        with_refresh,
        None,
    )
}

/// The authorization code grant: a single-use code, redeemed by the client it was issued
/// to, with the same redirect URI, the PKCE verifier and the same resource.
fn authorization_code(
    state: &mut State,
    client: &ClientSpec,
    form: &HashMap<String, String>,
    resource: Option<String>,
) -> HttpReply {
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
    } else if resource.is_some() && granted.resource.is_some() && resource != granted.resource {
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
        "authorization_code",
        &client.client_id,
        audience,
        granted.scopes,
        true,
        None,
    )
}

/// The refresh grant: the owner's token, bound to the same DPoP key, never widening the
/// scope; with rotation a used token presented again revokes its whole family.
fn refresh(
    state: &mut State,
    client: &ClientSpec,
    form: &HashMap<String, String>,
    resource: Option<String>,
) -> HttpReply {
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
        "refresh_token",
        &client.client_id,
        audience,
        scopes,
        true,
        Some((family, keep)),
    );
    match state.knobs.refresh_delay {
        Duration::ZERO => answer,
        delay => HttpReply::Delayed(delay, Box::new(answer)),
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
) -> HttpReply {
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
