//! The `WWW-Authenticate: Bearer ...` challenge of a 401 or 403 (RFC 6750 §3, RFC 9728 §5.1),
//! and its `DPoP ...` twin (RFC 9449 §7.1).

/// What a resource server's Bearer challenge says, as far as the client acts on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// RFC 9728 §5.1: where the Protected Resource Metadata is.
    pub(crate) resource_metadata: Option<String>,
    /// The scopes the server asks for, space-separated in the header.
    pub(crate) scope: Option<Vec<String>>,
    /// `invalid_token`, `insufficient_scope`, ...
    pub(crate) error: Option<String>,
}

impl Challenge {
    /// Parses the value of a `WWW-Authenticate` header; a challenge of another scheme
    /// yields an empty challenge (the client then discovers through the well-known URLs).
    pub(crate) fn parse(header: &str) -> Self {
        let mut found = Self::default();
        let Some(rest) = bearer_params(header) else {
            return found;
        };
        for (name, value) in params(rest) {
            match name.to_ascii_lowercase().as_str() {
                "resource_metadata" => found.resource_metadata = Some(value),
                "scope" => {
                    let scopes: Vec<String> =
                        value.split_whitespace().map(str::to_string).collect();
                    if !scopes.is_empty() {
                        found.scope = Some(scopes);
                    }
                }
                "error" => found.error = Some(value),
                _ => {}
            }
        }
        found
    }

    /// True for RFC 6750's `insufficient_scope`: the token is valid but too narrow.
    pub(crate) fn is_insufficient_scope(&self) -> bool {
        self.error.as_deref() == Some("insufficient_scope")
    }
}

/// The parameters after `Bearer` (or `DPoP`, RFC 9449 §7.1, which carries the same
/// parameters), when such a challenge is present.
fn bearer_params(header: &str) -> Option<&str> {
    let trimmed = header.trim_start();
    let is_ours =
        |scheme: &str| scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("dpop");
    let (scheme, rest) = trimmed
        .split_once(|c: char| c.is_ascii_whitespace())
        .unwrap_or((trimmed, ""));
    if is_ours(scheme) {
        return Some(rest);
    }
    // Several challenges in one header: find the first Bearer or DPoP one.
    let lower = trimmed.to_ascii_lowercase();
    [", bearer ", ", dpop "]
        .iter()
        .filter_map(|needle| lower.find(needle).map(|at| at + needle.len()))
        .min()
        .map(|at| &trimmed[at..])
}

/// `name=value` or `name="quoted \" value"` pairs, comma-separated.
fn params(mut text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    loop {
        text = text.trim_start_matches(|c: char| c == ',' || c.is_ascii_whitespace());
        let Some(eq) = text.find('=') else { break };
        let name = text[..eq].trim().to_string();
        if name.contains(|c: char| c.is_ascii_whitespace()) {
            // The start of another challenge (`Basic realm=...`): stop here.
            break;
        }
        text = &text[eq + 1..];
        let value;
        if let Some(quoted) = text.strip_prefix('"') {
            let mut value_text = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, next)) = chars.next() {
                            value_text.push(next);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value_text.push(c),
                }
            }
            value = value_text;
            text = &quoted[end.min(quoted.len())..];
        } else {
            let end = text.find(',').unwrap_or(text.len());
            value = text[..end].trim().to_string();
            text = &text[end..];
        }
        out.push((name, value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_names_its_metadata_scope_and_error() {
        let found = Challenge::parse(
            r#"Bearer error="insufficient_scope", scope="mcp:basic mcp:write", resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp""#,
        );
        assert_eq!(
            found.resource_metadata.as_deref(),
            Some("http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            found.scope,
            Some(vec!["mcp:basic".to_string(), "mcp:write".to_string()])
        );
        assert!(found.is_insufficient_scope());
    }

    #[test]
    fn unquoted_values_escapes_and_other_schemes_are_read() {
        let found =
            Challenge::parse(r#"Basic realm="x", Bearer error=invalid_token, scope="a\"b""#);
        assert_eq!(found.error.as_deref(), Some("invalid_token"));
        assert_eq!(found.scope, Some(vec!["a\"b".to_string()]));
        assert_eq!(Challenge::parse("Basic realm=\"x\""), Challenge::default());
        assert_eq!(Challenge::parse("Bearer"), Challenge::default());
    }

    #[test]
    fn a_dpop_challenge_is_read_like_a_bearer_one() {
        let found = Challenge::parse(
            r#"DPoP error="use_dpop_nonce", resource_metadata="http://127.0.0.1:9/prm""#,
        );
        assert_eq!(found.error.as_deref(), Some("use_dpop_nonce"));
        assert_eq!(
            found.resource_metadata.as_deref(),
            Some("http://127.0.0.1:9/prm")
        );
        let both = Challenge::parse(r#"Basic realm="x", DPoP algs="ES256", scope="a""#);
        assert_eq!(both.scope, Some(vec!["a".to_string()]));
    }
}
