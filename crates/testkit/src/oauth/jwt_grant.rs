//! The test authorization server's JWT bearer grant (RFC 7523 §2.1): an assertion signed
//! by an issuer it trusts, addressed to it and not expired, buys an access token. An
//! ID-JAG (`typ: oauth-id-jag+jwt`) is checked as enterprise-managed authorization asks:
//! issued to the authenticated client, for the resource asked, and used once.

use std::collections::HashMap;

use serde_json::Value;

use super::{State, issue, oauth_error, scopes_of};
use crate::jwt::{jwt_part, unix_now, verify_jwt};
use crate::server::HttpReply;

/// The grant type.
pub(crate) const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// The `typ` of an Identity Assertion JWT Authorization Grant.
pub(crate) const ID_JAG_TYP: &str = "oauth-id-jag+jwt";

/// Answers a JWT bearer grant of `client_id` (empty for an unauthenticated client).
pub(crate) fn jwt_bearer(
    state: &mut State,
    client_id: &str,
    form: &HashMap<String, String>,
) -> HttpReply {
    let Some(assertion) = form.get("assertion") else {
        return oauth_error(state, 400, "invalid_request", "assertion is missing");
    };
    let issuer = jwt_part(assertion, 1)
        .and_then(|claims| claims["iss"].as_str().map(str::to_string))
        .unwrap_or_default();
    let Some(keys) = state.trusted_issuers.get(&issuer).cloned() else {
        return oauth_error(
            state,
            400,
            "invalid_grant",
            &format!("the assertion's issuer {issuer:?} is not trusted"),
        );
    };
    let claims = match verify_jwt(assertion, &keys) {
        Ok(claims) => claims,
        Err(why) => return oauth_error(state, 400, "invalid_grant", &why),
    };
    let me = state.issuer.clone();
    let audiences: Vec<&str> = match &claims["aud"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences
        .iter()
        .any(|a| *a == me || *a == format!("{me}/") || *a == format!("{me}/token"))
    {
        return oauth_error(
            state,
            400,
            "invalid_grant",
            "the assertion is not addressed to this authorization server",
        );
    }
    if claims["exp"].as_u64().is_none_or(|exp| exp <= unix_now()) {
        return oauth_error(state, 400, "invalid_grant", "the assertion has expired");
    }
    let typ = jwt_part(assertion, 0)
        .and_then(|header| header["typ"].as_str().map(str::to_string))
        .unwrap_or_default();
    let mut resource = form.get("resource").cloned();
    if typ == ID_JAG_TYP {
        let named = claims["resource"].as_str().map(str::to_string);
        let jti = claims["jti"].as_str().unwrap_or_default().to_string();
        let problem = if claims["client_id"].as_str() != Some(client_id) || client_id.is_empty() {
            Some("the ID-JAG was issued to another client")
        } else if resource.is_some() && named.is_some() && resource != named {
            Some("the ID-JAG is for another resource")
        } else if jti.is_empty() || !state.assertion_ids.insert(jti) {
            Some("the ID-JAG's jti is missing or was used before")
        } else {
            None
        };
        if let Some(problem) = problem {
            return oauth_error(state, 400, "invalid_grant", problem);
        }
        resource = resource.or(named);
    }
    let mut scopes = scopes_of(form.get("scope"));
    if scopes.is_empty() {
        scopes = claims["scope"]
            .as_str()
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
    }
    let subject = claims["sub"].as_str().unwrap_or_default().to_string();
    state.counters.assertion_subjects.push(subject);
    issue(
        state,
        JWT_BEARER_GRANT,
        client_id,
        resource,
        scopes,
        false,
        None,
    )
}
