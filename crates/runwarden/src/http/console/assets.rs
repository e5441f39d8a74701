//! The console's one script and one stylesheet, embedded in the binary and served under
//! names that carry a hash of their content, so browsers may cache them for a year and a
//! new build is fetched at once.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::PageError;

const JS: &str = include_str!("assets/console.js");
const CSS: &str = include_str!("assets/console.css");

/// FNV-1a, 64 bits: enough to tell two builds' assets apart, computed at compile time.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

const JS_HASH: u64 = fnv1a(JS.as_bytes());
const CSS_HASH: u64 = fnv1a(CSS.as_bytes());

/// The script's path, with its hash.
pub(crate) fn js_path() -> String {
    format!("/console/assets/console.{JS_HASH:016x}.js")
}

/// The stylesheet's path, with its hash.
pub(crate) fn css_path() -> String {
    format!("/console/assets/console.{CSS_HASH:016x}.css")
}

/// `GET /console/assets/{name}`: the asset of that exact name, cached for a year.
pub(super) async fn serve(Path(name): Path<String>) -> Result<Response, PageError> {
    let (body, kind) = if format!("/console/assets/{name}") == js_path() {
        (JS, "text/javascript; charset=utf-8")
    } else if format!("/console/assets/{name}") == css_path() {
        (CSS, "text/css; charset=utf-8")
    } else {
        return Err(PageError::NotFound(format!("no console asset {name}")));
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    Ok(response)
}
