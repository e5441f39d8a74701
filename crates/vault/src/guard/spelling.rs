//! A URL as written, read before the URL parser rewrites it: its scheme, its authority
//! and the legacy numeric spellings of an IPv4 address the parser would silently accept.

use std::net::Ipv4Addr;
use std::str::FromStr;

use super::{GuardRefusal, invalid};

/// At most `max` characters of `text`.
pub(super) fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// Drops what the URL standard drops: leading and trailing C0 controls and spaces.
pub(super) fn trim_url(raw: &str) -> &str {
    raw.trim_matches(|c: char| c <= ' ')
}

/// Splits `scheme:rest`. A missing or malformed scheme is an invalid URL.
pub(super) fn split_scheme(text: &str) -> Result<(&str, &str), GuardRefusal> {
    let missing = || invalid("no scheme: write the URL as http://host/ or https://host/");
    let (scheme, rest) = text.split_once(':').ok_or_else(missing)?;
    let mut chars = scheme.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if well_formed {
        Ok((scheme, rest))
    } else {
        Err(missing())
    }
}

/// The authority as the URL standard reads it for http and https: after any run of
/// slashes or backslashes, up to the first slash, backslash, `?` or `#`.
pub(super) fn raw_authority(after_scheme: &str) -> &str {
    let start = after_scheme.trim_start_matches(['/', '\\']);
    let end = start.find(['/', '\\', '?', '#']).unwrap_or(start.len());
    &start[..end]
}

/// Whether the authority carries userinfo, and its host text (brackets kept, port cut).
pub(super) fn split_authority(authority: &str) -> (bool, &str) {
    let (has_userinfo, host_port) = match authority.rsplit_once('@') {
        Some((_, host_port)) => (true, host_port),
        None => (false, authority),
    };
    let host = if host_port.starts_with('[') {
        host_port
            .find(']')
            .map_or(host_port, |end| &host_port[..=end])
    } else {
        host_port.split(':').next().unwrap_or(host_port)
    };
    (has_userinfo, host)
}

/// True for a host the URL parser would read as an IPv4 address (dot-separated decimal
/// or `0x` hexadecimal parts, one trailing dot allowed) that is not the canonical form
/// `a.b.c.d`: four decimal parts, no leading zeros, no trailing dot.
pub(super) fn is_legacy_numeric(host: &str) -> bool {
    is_numeric_spelling(host) && !Ipv4Addr::from_str(host).is_ok_and(|ip| ip.to_string() == host)
}

pub(super) fn is_numeric_spelling(host: &str) -> bool {
    let body = host.strip_suffix('.').unwrap_or(host);
    let numeric_part = |part: &str| match part.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
    };
    !body.is_empty() && body.split('.').all(numeric_part)
}
