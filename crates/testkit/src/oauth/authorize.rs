//! The authorization endpoint: it approves at once and redirects with a code, bound to
//! the PKCE challenge, the redirect URI and the resource the request named.

use super::clients::redirect_matches;
use super::{State, oauth_error, query_of, scopes_of};
use crate::jwt::random_token;
use crate::server::{HttpReply, HttpRequest};

#[derive(Debug)]
pub(super) struct Code {
    pub(super) client_id: String,
    pub(super) redirect_uri: String,
    pub(super) challenge: String,
    pub(super) resource: Option<String>,
    pub(super) scopes: Vec<String>,
}

pub(super) fn authorization(state: &mut State, request: &HttpRequest) -> HttpReply {
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
            Err(_) => return HttpReply::text(400, "the redirect_uri does not parse"),
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
        HttpReply::Respond {
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
