//! Every secret the vault holds, in every spelling, is cut out of what a server sends back.

use std::borrow::Cow;
use std::sync::Arc;

use zeroize::Zeroizing;

use crate::error::EgressError;
use crate::guard::describe_location;
use crate::matcher::{Hit, SecretMatcher, merged_ranges};
use crate::message::EgressResponse;
use crate::secret::SecretValue;

/// What replaces every form of the secret.
pub(crate) const REDACTED: &str = "[redacted]";

/// Cuts every secret out of text a server sent back, judged by what the text means.
///
/// It searches with the vault's matcher over every stored secret and, for a call, one
/// more over the value placed on it (an OAuth access token is not a stored secret). The
/// matchers search the text as sent and decoded (JSON escapes in any spelling, percent
/// encoding); a hit in a decoded view is cut from the text as sent, whole escapes at a
/// time, so a JSON string stays a JSON string. Should a cut still break a JSON document
/// (a secret that spans two strings), the document is parsed, each string redacted on
/// its own and the whole written out again.
///
/// Text with no form in it is handed back as is, without a copy.
#[derive(Clone)]
pub(crate) struct Scrubber {
    matchers: Vec<Arc<SecretMatcher>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("matchers", &self.matchers)
            .finish()
    }
}

impl Scrubber {
    /// A scrubber that finds nothing.
    pub(crate) fn none() -> Self {
        Self {
            matchers: Vec::new(),
        }
    }

    /// Searches for the vault's secrets and, when given, the value placed on this call.
    pub(crate) fn new(
        vault: Option<Arc<SecretMatcher>>,
        placed: Option<(&str, &SecretValue)>,
    ) -> Self {
        let mut matchers: Vec<Arc<SecretMatcher>> = vault.into_iter().collect();
        if let Some((name, value)) = placed {
            let one = SecretMatcher::new([(name.to_string(), value.expose())]);
            if !one.is_empty() {
                matchers.push(Arc::new(one));
            }
        }
        matchers.retain(|m| !m.is_empty());
        Self { matchers }
    }

    /// The matchers, for the exfiltration check.
    pub(crate) fn matchers(&self) -> &[Arc<SecretMatcher>] {
        &self.matchers
    }

    fn hits(&self, text: &[u8], fold: bool) -> Vec<Hit> {
        self.matchers
            .iter()
            .flat_map(|m| m.hits(text, fold))
            .collect()
    }

    /// Where the forms occur in `text`, merged into disjoint ranges in order.
    fn ranges(&self, text: &[u8]) -> Vec<(usize, usize)> {
        if self.matchers.is_empty() {
            return Vec::new();
        }
        merged_ranges(self.hits(text, false))
    }

    fn rebuild(text: &[u8], ranges: &[(usize, usize)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        let mut from = 0;
        for &(start, end) in ranges {
            out.extend_from_slice(&text[from..start]);
            out.extend_from_slice(REDACTED.as_bytes());
            from = end;
        }
        out.extend_from_slice(&text[from..]);
        out
    }

    /// `text` redacted, or `None` when nothing was found. A JSON document stays one.
    fn redacted(&self, text: &[u8]) -> Option<Vec<u8>> {
        let ranges = self.ranges(text);
        if ranges.is_empty() {
            return None;
        }
        let out = Self::rebuild(text, &ranges);
        let was_json = || serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok();
        let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(&out).is_ok();
        if !is_json
            && was_json()
            && let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(text)
        {
            self.value(&mut value);
            // Written out again (keys in order), a secret that spanned two strings is
            // usually gone; should it still be there, the raw cut below is kept. The keys
            // are sorted here: serde_json keeps insertion order when a dependency turns
            // its `preserve_order` on, and this must not depend on that.
            sort_keys(&mut value);
            let again = Zeroizing::new(serde_json::to_vec(&value).unwrap_or_default());
            if self.ranges(&again).is_empty() {
                return Some(again.to_vec());
            }
        }
        Some(out)
    }

    /// Every string (and key) of a JSON value redacted in place; the names of the secrets
    /// found, by index into each matcher, are not needed here.
    pub(crate) fn value(&self, value: &mut serde_json::Value) -> bool {
        use serde_json::Value;
        match value {
            Value::String(s) => {
                let clean = self.text(s);
                if let Cow::Owned(clean) = clean {
                    let old = std::mem::replace(s, clean);
                    drop(Zeroizing::new(old));
                    return true;
                }
                false
            }
            Value::Array(items) => items.iter_mut().fold(false, |f, v| self.value(v) | f),
            Value::Object(map) => {
                let keys: Vec<String> = map.keys().cloned().collect();
                let mut found = false;
                for key in keys {
                    let clean = self.text(&key).into_owned();
                    if clean != key {
                        found = true;
                        if let Some(v) = map.remove(&key) {
                            map.insert(clean.clone(), v);
                        }
                    }
                    if let Some(v) = map.get_mut(&clean) {
                        found |= self.value(v);
                    }
                }
                found
            }
            _ => false,
        }
    }

    /// `bytes` with every form replaced; the same vector when there is none.
    pub(crate) fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        match self.redacted(&bytes) {
            None => bytes,
            Some(out) => {
                // The original held the secret: wipe it rather than leave it to the allocator.
                drop(Zeroizing::new(bytes));
                out
            }
        }
    }

    /// `text` with every form replaced; borrowed when there is none.
    pub(crate) fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(out) = self.redacted(text.as_bytes()) else {
            return Cow::Borrowed(text);
        };
        // A form that is not UTF-8 on its own can only cut inside a character when the
        // secret itself is not UTF-8; the lossy conversion then keeps the text valid.
        Cow::Owned(match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// An owned string with every form replaced; the same string when there is none.
    pub(crate) fn string(&self, text: String) -> String {
        match self.text(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(clean) => {
                drop(Zeroizing::new(text));
                clean
            }
        }
    }

    /// A redirect target with every form cut out, ignoring ASCII case.
    fn location(&self, location: String) -> String {
        let ranges = merged_ranges(self.hits(location.as_bytes(), true));
        if ranges.is_empty() {
            return location;
        }
        let out = Self::rebuild(location.as_bytes(), &ranges);
        drop(Zeroizing::new(location));
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The error with every detail that came from a server or a library scrubbed. The
    /// other variants carry only our own text (hosts from the caller's URL, fixed words).
    pub(crate) fn error(&self, error: EgressError) -> EgressError {
        match error {
            EgressError::Transport {
                host,
                detail,
                delivery,
            } => EgressError::Transport {
                host,
                detail: self.string(detail),
                delivery,
            },
            EgressError::Redirect {
                host,
                status,
                location,
            } => EgressError::Redirect {
                host,
                status,
                // V9 then V7: scrubbed while raw, then cut to host and path. Parsing
                // first would percent-encode a form and hide it from the scan; and since
                // it lowercases the host, the scan of a location ignores case.
                location: describe_location(&self.location(location)),
            },
            other => other,
        }
    }

    /// A response with its headers and body scrubbed. A body cut at the size limit may
    /// end in the first bytes of a form; that tail is cut too.
    pub(crate) fn response(&self, response: EgressResponse) -> EgressResponse {
        if self.matchers.is_empty() {
            return response;
        }
        let mut body = self.bytes(response.body);
        if response.truncated {
            self.cut_partial_tail(&mut body);
        }
        EgressResponse {
            headers: self.headers(response.headers),
            body,
            ..response
        }
    }

    /// Replaces a tail of `body` that is the start of a form (at least [`MIN_FORM_LEN`]
    /// bytes of it): what is left of a secret the size limit cut in two.
    fn cut_partial_tail(&self, body: &mut Vec<u8>) {
        let at = self
            .matchers
            .iter()
            .filter_map(|m| m.partial_tail(body))
            .min();
        if let Some(at) = at {
            body[at..].iter_mut().for_each(|b| *b = 0);
            body.truncate(at);
            body.extend_from_slice(REDACTED.as_bytes());
        }
    }

    /// Header names and values, scrubbed.
    pub(crate) fn headers(&self, headers: Vec<(String, String)>) -> Vec<(String, String)> {
        if self.matchers.is_empty() {
            return headers;
        }
        headers
            .into_iter()
            .map(|(name, value)| (self.string(name), self.string(value)))
            .collect()
    }
}

/// The scrub of a body that grows a chunk at a time, as a caller's `complete_when` hook
/// sees it: what was cleaned up to the last line break is kept, and only what came after
/// is searched again. JSON escapes and percent-encoding never span a line break, so the
/// window never cuts a spelling of a secret in two. The view is the body itself until
/// something was redacted.
pub(crate) struct StreamScrub {
    scrubber: Scrubber,
    /// How much of the body is settled (ends at a line break).
    settled: usize,
    /// The settled part, cleaned; empty while nothing was redacted from it.
    clean: Vec<u8>,
    changed: bool,
}

impl StreamScrub {
    pub(crate) fn new(scrubber: Scrubber) -> Self {
        Self {
            scrubber,
            settled: 0,
            clean: Vec::new(),
            changed: false,
        }
    }

    /// The whole body so far, scrubbed.
    pub(crate) fn view<'a>(&mut self, body: &'a [u8]) -> Cow<'a, [u8]> {
        if body.len() < self.settled {
            // Not a growing body after all: start over.
            *self = Self::new(self.scrubber.clone());
        }
        if let Some(at) = memchr::memrchr(b'\n', &body[self.settled..]) {
            let end = self.settled + at + 1;
            let part = &body[self.settled..end];
            match self.scrubber.redacted(part) {
                Some(out) => {
                    if !self.changed {
                        self.clean = body[..self.settled].to_vec();
                        self.changed = true;
                    }
                    self.clean.extend_from_slice(&out);
                }
                None if self.changed => self.clean.extend_from_slice(part),
                None => {}
            }
            self.settled = end;
        }
        let rest = &body[self.settled..];
        let rest_clean = self.scrubber.redacted(rest);
        if !self.changed && rest_clean.is_none() {
            return Cow::Borrowed(body);
        }
        let settled: &[u8] = if self.changed {
            &self.clean
        } else {
            &body[..self.settled]
        };
        let mut out = Vec::with_capacity(settled.len() + rest.len());
        out.extend_from_slice(settled);
        out.extend_from_slice(rest_clean.as_deref().unwrap_or(rest));
        Cow::Owned(out)
    }
}

/// Every object of `value` with its keys in sorted order, whatever serde_json's map keeps.
fn sort_keys(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> =
                std::mem::take(map).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, mut item) in entries {
                sort_keys(&mut item);
                map.insert(key, item);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::Delivery;
    use crate::placement::Placement;
    use base64::Engine;

    const SIGIL: &str = "sigil-9d1e/+x?&=\"ü";

    /// The placement no longer decides what is searched for: every form of every
    /// secret is. It stays in the tests' calls as the record of what was sent.
    fn scrubber(value: &str, _placement: Placement) -> Scrubber {
        let value = SecretValue::new(value.as_bytes().to_vec());
        Scrubber::new(None, Some(("test", &value)))
    }

    fn clean(scrubber: &Scrubber, text: &str) -> String {
        scrubber.text(text).into_owned()
    }

    #[test]
    fn the_raw_value_is_redacted_wherever_it_appears() {
        let s = scrubber("tok-12345", Placement::Bearer);
        assert_eq!(
            clean(&s, "a tok-12345 b tok-12345tok-12345"),
            "a [redacted] b [redacted][redacted]"
        );
    }

    #[test]
    fn text_without_the_secret_is_not_copied() {
        let s = scrubber("tok-12345", Placement::Bearer);
        assert!(matches!(s.text("nothing here"), Cow::Borrowed(_)));
        let body = b"nothing here either".to_vec();
        let address = body.as_ptr();
        let out = s.bytes(body);
        assert_eq!(out.as_ptr(), address, "the same allocation");
    }

    #[test]
    fn basic_redacts_the_pair_its_base64_and_the_password_alone() {
        let s = scrubber("svc:hunter2-pw", Placement::Basic);
        let encoded = base64::engine::general_purpose::STANDARD.encode("svc:hunter2-pw");
        let echoed = format!("auth Basic {encoded}; pair svc:hunter2-pw; pw hunter2-pw; user svc");
        assert_eq!(
            clean(&s, &echoed),
            "auth Basic [redacted]; pair [redacted]; pw [redacted]; user svc",
            "the user name alone is not secret"
        );
    }

    #[test]
    fn a_query_value_is_redacted_raw_and_percent_encoded_in_either_hex_case() {
        let s = scrubber("a b/c&d=é", Placement::Query { name: "key".into() });
        let upper: String = url::form_urlencoded::byte_serialize("a b/c&d=é".as_bytes()).collect();
        assert_eq!(
            upper, "a+b%2Fc%26d%3D%C3%A9",
            "the encoder the placement uses"
        );
        let lower = "a+b%2fc%26d%3d%c3%a9";
        assert_eq!(
            clean(&s, &format!("GET /?key={upper} or {lower} or a b/c&d=é")),
            "GET /?key=[redacted] or [redacted] or [redacted]"
        );
    }

    #[test]
    fn a_named_header_value_is_redacted_without_its_prefix() {
        let s = scrubber(
            "k3y-value",
            Placement::Header {
                name: "x-key".into(),
                prefix: Some("Token ".into()),
            },
        );
        assert_eq!(clean(&s, "got Token k3y-value"), "got Token [redacted]");
    }

    #[test]
    fn the_json_escaped_forms_are_redacted_as_serde_python_php_and_go_write_them() {
        let s = scrubber(SIGIL, Placement::Bearer);
        let serde = serde_json::to_string(SIGIL).unwrap();
        let serde = &serde[1..serde.len() - 1];
        let python = r#"sigil-9d1e/+x?&=\"\u00fc"#;
        let php = r#"sigil-9d1e\/+x?&=\"\u00fc"#;
        let go = r#"sigil-9d1e/+x?\u0026=\"ü"#;
        for form in [serde, python, php, go] {
            let body = format!(r#"{{"error":{{"message":"bad key {form}"}}}}"#);
            let cleaned = clean(&s, &body);
            assert_eq!(cleaned, r#"{"error":{"message":"bad key [redacted]"}}"#);
            assert!(serde_json::from_str::<serde_json::Value>(&cleaned).is_ok());
        }
    }

    #[test]
    fn the_json_escaped_forms_of_the_basic_and_query_forms_are_redacted_too() {
        let s = scrubber("svc:p\"w/1234", Placement::Basic);
        assert_eq!(clean(&s, r#"pw p\"w\/1234"#), "pw [redacted]");
        assert_eq!(clean(&s, r#"pair svc:p\"w/1234"#), "pair [redacted]");
    }

    #[test]
    fn overlapping_forms_become_one_redaction() {
        // The password is inside the pair: one cut, not a cut inside a cut.
        let s = scrubber("user:user:pass", Placement::Basic);
        assert_eq!(clean(&s, "xuser:user:passy"), "x[redacted]y");
    }

    #[test]
    fn forms_shorter_than_four_bytes_are_not_searched_for() {
        let s = scrubber("svc:pw", Placement::Basic);
        assert_eq!(
            clean(&s, "pw stays, svc:pw goes"),
            "pw stays, [redacted] goes"
        );
        let tiny = scrubber("abc", Placement::Bearer);
        assert_eq!(clean(&tiny, "abc"), "abc");
    }

    #[test]
    fn a_body_cut_inside_the_secret_loses_the_part_that_is_left() {
        let s = scrubber("tok-12345", Placement::Bearer);
        let response = |body: &str, truncated: bool| EgressResponse {
            status: 200,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            truncated,
            audit_id: None,
        };
        let cut = s.response(response("echo: tok-123", true));
        assert_eq!(cut.body, b"echo: [redacted]");
        // Fewer than four bytes of it say nothing; a body read to its end is left alone.
        assert_eq!(s.response(response("echo: tok", true)).body, b"echo: tok");
        assert_eq!(
            s.response(response("echo: tok-123", false)).body,
            b"echo: tok-123"
        );
    }

    #[test]
    fn without_a_secret_nothing_is_changed() {
        let s = Scrubber::new(None, None);
        assert_eq!(clean(&s, "anything at all"), "anything at all");
    }

    #[test]
    fn transport_and_redirect_details_are_scrubbed_and_other_errors_kept() {
        let s = scrubber("tok-12345", Placement::Bearer);
        let e = s.error(EgressError::Transport {
            host: "h".into(),
            detail: "peer said tok-12345".into(),
            delivery: Delivery::MaybeDelivered,
        });
        assert_eq!(
            e.delivery(),
            Delivery::MaybeDelivered,
            "V8: the fact is kept"
        );
        assert_eq!(
            e.to_string(),
            "transport failure talking to h: peer said [redacted]"
        );
        let redirect = |location: &str| {
            s.error(EgressError::Redirect {
                host: "h".into(),
                status: 302,
                location: location.into(),
            })
            .to_string()
        };
        assert_eq!(
            redirect("http://evil.example/tok-12345/x?q=tok-12345"),
            "h answered 302 redirecting to evil.example/[redacted]/x; redirects are never followed",
            "scrubbed, then cut to host and path"
        );
        // Parsing lowercases a host: the scrub has to come first.
        let e = redirect("http://TOK-12345.evil.example/tok-12345");
        assert!(!e.to_lowercase().contains("tok-12345"), "{e}");
    }

    #[test]
    fn header_names_and_values_are_scrubbed() {
        let s = scrubber("tok-12345", Placement::Bearer);
        let headers = s.headers(vec![
            ("x-echo".into(), "Bearer tok-12345".into()),
            ("tok-12345".into(), "v".into()),
        ]);
        assert_eq!(
            headers,
            vec![
                ("x-echo".to_string(), "Bearer [redacted]".to_string()),
                ("[redacted]".to_string(), "v".to_string()),
            ]
        );
    }
}
