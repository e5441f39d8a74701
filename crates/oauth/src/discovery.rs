//! Where the authorization server is and what it offers: Protected Resource Metadata
//! (RFC 9728) and authorization server metadata (RFC 8414, OpenID discovery), with the
//! fallbacks of the MCP authorization spec (2025-11-25) and of 2025-03-26.

use serde::Deserialize;
use url::Url;

/// RFC 9728 Protected Resource Metadata, the fields the client uses.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ResourceMetadata {
    pub(crate) resource: Option<String>,
    #[serde(default)]
    pub(crate) authorization_servers: Vec<String>,
    pub(crate) scopes_supported: Option<Vec<String>>,
}

/// RFC 8414 authorization server metadata, the fields the client uses.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub(crate) struct ServerMetadata {
    pub(crate) issuer: String,
    pub(crate) authorization_endpoint: Option<String>,
    pub(crate) token_endpoint: String,
    pub(crate) registration_endpoint: Option<String>,
    pub(crate) scopes_supported: Option<Vec<String>>,
    pub(crate) token_endpoint_auth_methods_supported: Option<Vec<String>>,
    pub(crate) code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) client_id_metadata_document_supported: bool,
    #[serde(default)]
    pub(crate) authorization_response_iss_parameter_supported: bool,
    /// RFC 9449 §5.1: the algorithms the server takes DPoP proofs in.
    pub(crate) dpop_signing_alg_values_supported: Option<Vec<String>>,
}

/// `scheme://host[:port]` of a URL.
pub(crate) fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// RFC 9728 §3.1 and the MCP spec's order when the challenge names no metadata URL: the
/// path-inserted well-known URL first (when the server URL has a path), then the root.
pub(crate) fn resource_metadata_candidates(server: &Url) -> Vec<String> {
    let base = origin(server);
    let path = server.path().trim_end_matches('/');
    let mut out = Vec::new();
    if !path.is_empty() {
        out.push(format!("{base}/.well-known/oauth-protected-resource{path}"));
    }
    out.push(format!("{base}/.well-known/oauth-protected-resource"));
    out
}

/// The MCP spec's order for an issuer: with a path, RFC 8414 path insertion, then OpenID
/// path insertion, then OpenID path appending; without one, RFC 8414 then OpenID. The root
/// RFC 8414 URL is never asked for an issuer with a path (it is another issuer's).
pub(crate) fn server_metadata_candidates(issuer: &Url) -> Vec<String> {
    let base = origin(issuer);
    let path = issuer.path().trim_end_matches('/');
    if path.is_empty() {
        vec![
            format!("{base}/.well-known/oauth-authorization-server"),
            format!("{base}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{base}/.well-known/oauth-authorization-server{path}"),
            format!("{base}/.well-known/openid-configuration{path}"),
            format!("{base}{path}/.well-known/openid-configuration"),
        ]
    }
}

/// Two URLs naming the same thing, a trailing slash aside.
pub(crate) fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// RFC 9728 §3.3 as the MCP spec applies it: the metadata's `resource` must be this server
/// or a parent of it (same origin, and the server's path at or under the resource's path).
pub(crate) fn resource_covers(resource: &str, server: &Url) -> bool {
    let Ok(resource) = Url::parse(resource) else {
        return false;
    };
    if resource.origin() != server.origin() {
        return false;
    }
    let want = resource.path().trim_end_matches('/');
    let have = server.path().trim_end_matches('/');
    want.is_empty() || have == want || have.starts_with(&format!("{want}/"))
}

/// The RFC 8707 resource indicator of a server URL: no fragment, no query.
pub(crate) fn canonical_resource(server: &Url) -> String {
    let mut url = server.clone();
    url.set_fragment(None);
    url.set_query(None);
    let text = url.to_string();
    if url.path() == "/" {
        text.trim_end_matches('/').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_metadata_is_tried_path_first_then_root() {
        let server = Url::parse("http://127.0.0.1:8/mcp").unwrap();
        assert_eq!(
            resource_metadata_candidates(&server),
            [
                "http://127.0.0.1:8/.well-known/oauth-protected-resource/mcp",
                "http://127.0.0.1:8/.well-known/oauth-protected-resource"
            ]
        );
    }

    #[test]
    fn an_issuer_with_a_path_never_asks_the_root_metadata() {
        let issuer = Url::parse("http://a.test/tenant1").unwrap();
        assert_eq!(
            server_metadata_candidates(&issuer),
            [
                "http://a.test/.well-known/oauth-authorization-server/tenant1",
                "http://a.test/.well-known/openid-configuration/tenant1",
                "http://a.test/tenant1/.well-known/openid-configuration"
            ]
        );
        let root = Url::parse("http://a.test").unwrap();
        assert_eq!(
            server_metadata_candidates(&root),
            [
                "http://a.test/.well-known/oauth-authorization-server",
                "http://a.test/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn a_resource_covers_only_its_own_origin_and_path() {
        let server = Url::parse("http://localhost:5/mcp").unwrap();
        assert!(resource_covers("http://localhost:5/mcp", &server));
        assert!(resource_covers("http://localhost:5", &server));
        assert!(!resource_covers("https://evil.example.com/mcp", &server));
        assert!(!resource_covers("http://localhost:5/mc", &server));
        assert!(!resource_covers("http://localhost:6/mcp", &server));
    }
}
