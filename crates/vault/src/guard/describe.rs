//! How a target is shown in audit rows and errors: host and path, never the query,
//! the fragment or userinfo.

use url::{Host, Url};

use super::spelling::{cut, raw_authority, split_authority, split_scheme, trim_url};

/// A best-effort (host, path) for the audit row of a call that may have been refused:
/// never the query string, never the fragment, never userinfo. Unparsable input gives
/// the host as written when it is made of plain host characters, else nothing.
pub(crate) fn describe_for_audit(raw_url: &str) -> (String, String) {
    let text = trim_url(raw_url);
    if let Ok(url) = Url::parse(text)
        && matches!(url.scheme(), "http" | "https")
    {
        let host = match url.host() {
            Some(Host::Domain(name)) => name.strip_suffix('.').unwrap_or(name).to_owned(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => ip.to_string(),
            None => String::new(),
        };
        // A refused row keeps the port, as an answered one does (`Target::audit_host`):
        // `127.0.0.1:8080` and `127.0.0.1:9090` are different services. `port()` is
        // `None` for the scheme's default port.
        let host = match (url.port(), host.contains(':')) {
            (None, _) => host,
            (Some(port), false) => format!("{host}:{port}"),
            (Some(port), true) => format!("[{host}]:{port}"),
        };
        return (cut(&host, 253), cut(url.path(), 256));
    }
    let Ok((scheme, rest)) = split_scheme(text) else {
        return (String::new(), String::new());
    };
    // Another scheme (`file:///etc/passwd`, `ftp://...`) is shown as what it is: the
    // scheme and authority in the host column and the path beside it, never a path
    // segment read as a host (`etc`). Userinfo, query and fragment stay out.
    let scheme = scheme.to_ascii_lowercase();
    let plain_scheme = scheme
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if let Ok(url) = Url::parse(text)
        && plain_scheme
    {
        let host = url.host_str().unwrap_or_default();
        let host = match url.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        };
        return (cut(&host, 253), cut(url.path(), 256));
    }
    let (_, host) = split_authority(raw_authority(rest));
    let plain = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
    let host = if plain && plain_scheme {
        cut(&format!("{scheme}://{}", host.to_ascii_lowercase()), 64)
    } else {
        String::new()
    };
    (host, String::new())
}

/// A redirect target as errors show it: host and path, never the query (V7);
/// `(no location)` when nothing readable is left.
pub(crate) fn describe_location(raw: &str) -> String {
    let (host, path) = describe_for_audit(raw);
    match (host.is_empty(), path.is_empty()) {
        (true, true) => "(no location)".into(),
        (true, false) => path,
        (false, _) => format!("{host}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_descriptions_keep_the_port_and_the_scheme_but_no_query_and_no_userinfo() {
        let cases = [
            (
                "http://user:pw@Example.COM./a/b?token=x#f",
                ("example.com", "/a/b"),
            ),
            ("http://[::1]:8080/p?q=1", ("[::1]:8080", "/p")),
            ("https://api.example:443/p", ("api.example", "/p")),
            ("http://127.0.0.1:9/p", ("127.0.0.1:9", "/p")),
            (
                "ftp://u:pw@files.example/x?y",
                ("ftp://files.example", "/x"),
            ),
            ("file:///etc/passwd", ("file://", "/etc/passwd")),
            ("garbage", ("", "")),
            ("http://exa mple.com/?secret", ("", "")),
        ];
        for (url, (host, path)) in cases {
            assert_eq!(
                describe_for_audit(url),
                (host.to_owned(), path.to_owned()),
                "{url}"
            );
        }
    }
}
