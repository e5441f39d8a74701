//! Console sign-in: a pasted API token, verified like a bearer token, opens a session
//! (a random 256-bit id in an `HttpOnly; SameSite=Strict` cookie, `Secure` over TLS);
//! only the id's hash is stored, bound to the token, with an expiry. Sign-out deletes the
//! row. Every state-changing request carries the session's CSRF token, compared in
//! constant time, and may not come from another origin.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use runwarden_vault::{ApiToken, Role, token_verify};

use super::render::{self, Form};
use super::session_id::{csrf_matches, session_create, session_csrf, session_hash, session_lookup};
use super::{AppState, PageError};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "rw_session";
/// The header a script sends the CSRF token in (forms send the `csrf` field).
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";

use runwarden_base::now_ms;

/// A signed-in request: the live token it acts for and its session's CSRF token.
#[derive(Clone)]
pub(crate) struct Signed {
    pub(crate) token: ApiToken,
    pub(crate) csrf: String,
    hash: [u8; 32],
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signed")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Signed {
    /// True when the token may change things (cancel, answer decisions).
    pub(crate) fn is_operator(&self) -> bool {
        self.token.role.allows(Role::Operator)
    }

    /// True while the session still answers: not signed out, not expired, its token not
    /// revoked. Live streams ask before each read, so they end with the session.
    pub(crate) async fn still_live(&self, state: &AppState) -> bool {
        match state.sessions.session_find(self.hash, now_ms()).await {
            Ok(found) => found.is_some(),
            Err(error) => {
                tracing::warn!(%error, "could not check a console session; ending its stream");
                false
            }
        }
    }

    /// A viewer sees no buttons, and the server refuses their state changes anyway.
    pub(crate) fn require_operator(&self) -> Result<(), PageError> {
        if self.is_operator() {
            return Ok(());
        }
        Err(PageError::Forbidden(format!(
            "the token {} is a viewer: it may look but not change anything; sign in with an operator token",
            self.token.name
        )))
    }

    /// A state-changing request must carry this session's CSRF token (the `csrf`
    /// field or the `X-CSRF-Token` header), compared in constant time.
    pub(crate) fn check_csrf(&self, headers: &HeaderMap, form: &Form) -> Result<(), PageError> {
        let presented = form
            .get("csrf")
            .or_else(|| headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()));
        match presented {
            Some(token) if csrf_matches(&self.csrf, token) => Ok(()),
            Some(_) => Err(PageError::Csrf(
                "the form's CSRF token does not match your session: reload the page and try again".into(),
            )),
            None => Err(PageError::Csrf(
                "this request carries no CSRF token: use the console's own buttons, or send the page's token in the X-CSRF-Token header".into(),
            )),
        }
    }
}

/// The session id the request's cookie carries, if any.
fn cookie_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
}

/// The signed-in session of a request, if it has a live one.
pub(crate) async fn signed_in(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<Signed>, PageError> {
    let Some(id) = cookie_of(headers) else {
        return Ok(None);
    };
    // O4: the lookup joins the token, so a revoked token ends its sessions here.
    let Some(session) = session_lookup(&*state.sessions, id, now_ms()).await? else {
        return Ok(None);
    };
    Ok(Some(Signed {
        token: session.token,
        csrf: session_csrf(id),
        hash: session_hash(id),
    }))
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        signed_in(state, &parts.headers)
            .await?
            .ok_or(PageError::SignedOut)
    }
}

/// A state-changing request may not come from another origin. Browsers say where a
/// request comes from in `Sec-Fetch-Site` (whatever the referrer policy) and usually in
/// `Origin`; under `Referrer-Policy: no-referrer` a form's `Origin` is `null`, which says
/// nothing. Either header naming another site refuses the request (SameSite=Strict already
/// keeps the cookie off cross-site requests; this also covers the sign-in form). The CSRF
/// token stays the check that does not depend on the browser.
pub(crate) fn same_origin(headers: &HeaderMap) -> Result<(), PageError> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && !matches!(site, "same-origin" | "none")
    {
        return Err(PageError::Csrf(format!(
            "this request came from another site (Sec-Fetch-Site: {site}); open the console at its own address"
        )));
    }
    let Some(origin) = text(header::ORIGIN).filter(|o| *o != "null") else {
        return Ok(());
    };
    let host = text(header::HOST).unwrap_or_default();
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
    if origin_host.eq_ignore_ascii_case(host) && !host.is_empty() {
        return Ok(());
    }
    Err(PageError::Csrf(format!(
        "this request came from another origin ({origin}); open the console at its own address"
    )))
}

/// The session cookie: HttpOnly, SameSite=Strict, Path=/, Secure over TLS, for `max_age`
/// seconds (0 clears it).
fn cookie(value: &str, max_age: u64, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"
    ))
    .ok()
}

/// `POST /console/login`: the form's `token` opens a session, or the sign-in page says
/// why not (401).
pub(super) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, PageError> {
    same_origin(&headers)?;
    let form = Form::parse(&body);
    let presented = form.get("token").unwrap_or_default().trim();
    let Some(token) = token_verify(&*state.tokens, presented).await? else {
        let page = render::sign_in(Some(&format!(
            "that is not a live API token (unknown or revoked): paste one that `{}` printed",
            crate::hints::TOKEN_HINT
        )));
        return Ok((
            axum::http::StatusCode::UNAUTHORIZED,
            Html(page.into_string()),
        )
            .into_response());
    };
    let ttl = state.config.console.session;
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let (id, _session) = session_create(&*state.sessions, &token, now_ms(), ttl_ms).await?;
    // Expired rows of earlier sessions go at each sign-in, so the table stays small.
    if let Err(error) = state.sessions.session_purge(now_ms()).await {
        tracing::warn!(%error, "could not purge expired console sessions");
    }
    tracing::info!(actor = %token.name, role = token.role.as_str(), "console sign-in");
    let secure = state.config.serve.tls.is_some();
    let Some(set_cookie) = cookie(id.expose(), ttl.as_secs(), secure) else {
        return Err(PageError::Internal);
    };
    let mut response = Redirect::to("/runs").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, set_cookie);
    Ok(response)
}

/// `POST /console/logout`: deletes the session's row and clears the cookie.
pub(super) async fn logout(
    State(state): State<AppState>,
    signed: Signed,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, PageError> {
    same_origin(&headers)?;
    signed.check_csrf(&headers, &Form::parse(&body))?;
    state.sessions.session_delete(signed.hash).await?;
    tracing::info!(actor = %signed.token.name, "console sign-out");
    let mut response = Redirect::to("/").into_response();
    if let Some(clear) = cookie("", 0, state.config.serve.tls.is_some()) {
        response.headers_mut().insert(header::SET_COOKIE, clear);
    }
    Ok(response)
}
