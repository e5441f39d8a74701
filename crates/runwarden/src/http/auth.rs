//! Bearer tokens to roles: no or an unknown token is 401, a role that may not do
//! this is 403. Only a token's hash is stored; the vault compares hashes.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use runwarden_vault::{ApiToken, Role, token_hash, token_verify};

use super::AppState;
use super::error::ApiError;

/// What a route needs: the state to check tokens against and the role it requires.
#[derive(Clone)]
pub(crate) struct Guard {
    pub(crate) state: AppState,
    pub(crate) role: Role,
}

/// The token of an `Authorization: Bearer <token>` header, if the header has that form.
fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The middleware in front of every route but health: checks the token and the role,
/// then hands the caller's [`ApiToken`] to the handler as a request extension.
pub(crate) async fn require(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(presented) = bearer(&request) else {
        return Err(ApiError::Unauthorized(format!(
            "send Authorization: Bearer <token>; `{}` makes one",
            crate::hints::TOKEN_HINT
        )));
    };
    // Any store fault here is a 503 the client may retry, never a 401: a store that cannot
    // say whether a token is live has not said that it is not.
    let verified = token_verify(&*guard.state.tokens, presented)
        .await
        .map_err(ApiError::StoreUnavailable)?;
    let Some(token) = verified else {
        return Err(ApiError::Unauthorized(
            "the bearer token is not a live token (unknown or revoked)".into(),
        ));
    };
    if !token.role.allows(guard.role) {
        return Err(ApiError::Forbidden(format!(
            "a {} token may not do this: it needs the {} role",
            token.role.as_str(),
            guard.role.as_str()
        )));
    }
    let name = TokenName(token.name.clone());
    let held = Presented(token_hash(presented));
    request.extensions_mut().insert::<ApiToken>(token);
    request.extensions_mut().insert(held);
    let mut response = next.run(request).await;
    // For the request's log line (O5): who asked, by the token's name, never its value.
    response.extensions_mut().insert(name);
    Ok(response)
}

/// The name of the token a request was allowed with, on its response.
#[derive(Debug, Clone)]
pub(crate) struct TokenName(pub(crate) String);

/// The hash of the token a request was allowed with (never the token itself), so a
/// long-lived answer can ask again whether it is still live.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Presented([u8; 32]);

impl Presented {
    /// True while the token is live (not revoked). A store that cannot answer counts as
    /// not live: the stream ends and the client reconnects through the guard.
    pub(crate) async fn still_live(&self, state: &super::AppState) -> bool {
        match state.tokens.token_find(self.0).await {
            Ok(found) => found.is_some(),
            Err(error) => {
                tracing::warn!(%error, "could not check a stream's token; ending the stream");
                false
            }
        }
    }
}
