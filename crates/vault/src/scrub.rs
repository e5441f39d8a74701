//! V9: the placed secret, in every form it was sent, is cut out of what a server sends back.

use std::borrow::Cow;

use base64::Engine;
use memchr::memmem;
use zeroize::Zeroizing;

use crate::egress::{EgressResponse, describe_location};
use crate::error::EgressError;
use crate::placement::Placement;
use crate::secret::SecretValue;

/// What replaces every form of the secret.
pub(crate) const REDACTED: &str = "[redacted]";

/// Forms shorter than this are not searched for. A 1 to 3 byte form (a tiny password)
/// matches ordinary text everywhere ("true", a JSON key, a digit run), so redacting it
/// would shred the protocol while protecting nothing an attacker could not guess; the
/// longer forms that contain it (`user:password`, its base64) are still cut.
const MIN_FORM_LEN: usize = 4;

/// Cuts the forms of one placed secret out of text a server sent back (SPEC V9).
///
/// The forms are the ones the placement put on the wire, and what a server is likely to
/// echo of them: the raw value; for basic, the `user:password` text, its base64 and the
/// password alone; for a query placement, the value percent-encoded as the URL encoder
/// wrote it (and with lowercase hex); and the JSON-escaped spelling of each (as serde and
/// JavaScript write it, as Python writes it with `ensure_ascii`, as PHP writes it with
/// `\/`, and as Go writes `<`, `>` and `&`). Each form is held zeroized.
///
/// Searching is `memchr::memmem` per form; text with no form in it is handed back as is,
/// without a copy, so the common case costs one SIMD scan per form.
pub(crate) struct Scrubber {
    forms: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("forms", &self.forms.len())
            .finish_non_exhaustive()
    }
}

impl Scrubber {
    /// A scrubber that finds nothing: no secret was placed.
    pub(crate) fn none() -> Self {
        Self { forms: Vec::new() }
    }

    /// The forms of `secret` as `placement` sent it. Without a secret, finds nothing.
    pub(crate) fn new(secret: Option<&SecretValue>, placement: Option<&Placement>) -> Self {
        let Some(secret) = secret else {
            return Self::none();
        };
        let raw = secret.expose();
        let mut sent: Vec<Zeroizing<Vec<u8>>> = vec![Zeroizing::new(raw.to_vec())];
        match placement {
            Some(Placement::Basic) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(raw);
                sent.push(Zeroizing::new(encoded.into_bytes()));
                if let Some(at) = raw.iter().position(|&b| b == b':') {
                    sent.push(Zeroizing::new(raw[at + 1..].to_vec()));
                }
            }
            Some(Placement::Query { .. }) => {
                // The same encoder `url::Url::query_pairs_mut().append_pair` uses.
                let encoded: Zeroizing<String> =
                    Zeroizing::new(url::form_urlencoded::byte_serialize(raw).collect());
                let lower = Zeroizing::new(lowercase_hex_escapes(encoded.as_bytes()));
                sent.push(Zeroizing::new(encoded.as_bytes().to_vec()));
                sent.push(lower);
            }
            // Bearer and a named header send the raw value (the prefix is not secret).
            _ => {}
        }
        let mut forms: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for form in sent {
            if let Ok(text) = std::str::from_utf8(&form) {
                for escaped in json_escapes(text) {
                    push_unique(&mut forms, escaped);
                }
            }
            push_unique(&mut forms, form);
        }
        forms.retain(|f| f.len() >= MIN_FORM_LEN);
        Self { forms }
    }

    /// Where the forms occur in `text`, merged into disjoint ranges in order.
    fn ranges(&self, text: &[u8]) -> Vec<(usize, usize)> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for form in &self.forms {
            for at in memmem::find_iter(text, form.as_slice()) {
                ranges.push((at, at + form.len()));
            }
        }
        Self::merge(ranges)
    }

    /// Like [`Self::ranges`], ignoring ASCII case (lowercasing keeps every offset).
    fn ranges_ignoring_case(&self, text: &[u8]) -> Vec<(usize, usize)> {
        let lower = Zeroizing::new(text.to_ascii_lowercase());
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for form in &self.forms {
            let form = Zeroizing::new(form.to_ascii_lowercase());
            for at in memmem::find_iter(lower.as_slice(), form.as_slice()) {
                ranges.push((at, at + form.len()));
            }
        }
        Self::merge(ranges)
    }

    fn merge(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
        if ranges.len() > 1 {
            ranges.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
            for (start, end) in ranges {
                match merged.last_mut() {
                    Some(last) if start < last.1 => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            ranges = merged;
        }
        ranges
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

    /// `bytes` with every form replaced; the same vector when there is none.
    pub(crate) fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        let ranges = self.ranges(&bytes);
        if ranges.is_empty() {
            return bytes;
        }
        let out = Self::rebuild(&bytes, &ranges);
        // The original held the secret: wipe it rather than leave it to the allocator.
        drop(Zeroizing::new(bytes));
        out
    }

    /// `bytes` with every form replaced, borrowed when there is none: what a caller's
    /// `complete_when` hook sees of a body still being read.
    pub(crate) fn view<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let ranges = self.ranges(bytes);
        if ranges.is_empty() {
            return Cow::Borrowed(bytes);
        }
        Cow::Owned(Self::rebuild(bytes, &ranges))
    }

    /// `text` with every form replaced; borrowed when there is none.
    pub(crate) fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let ranges = self.ranges(text.as_bytes());
        if ranges.is_empty() {
            return Cow::Borrowed(text);
        }
        let out = Self::rebuild(text.as_bytes(), &ranges);
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
        let ranges = self.ranges_ignoring_case(location.as_bytes());
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
        if self.forms.is_empty() {
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
        let longest = self
            .forms
            .iter()
            .filter_map(|form| {
                (MIN_FORM_LEN..form.len())
                    .rev()
                    .find(|&n| body.ends_with(&form[..n]))
            })
            .max();
        if let Some(n) = longest {
            let at = body.len() - n;
            body[at..].iter_mut().for_each(|b| *b = 0);
            body.truncate(at);
            body.extend_from_slice(REDACTED.as_bytes());
        }
    }

    /// Header names and values, scrubbed.
    pub(crate) fn headers(&self, headers: Vec<(String, String)>) -> Vec<(String, String)> {
        if self.forms.is_empty() {
            return headers;
        }
        headers
            .into_iter()
            .map(|(name, value)| (self.string(name), self.string(value)))
            .collect()
    }
}

fn push_unique(forms: &mut Vec<Zeroizing<Vec<u8>>>, form: Zeroizing<Vec<u8>>) {
    if !forms.iter().any(|f| f.as_slice() == form.as_slice()) {
        forms.push(form);
    }
}

/// `%2f` for `%2F`: some servers re-encode a query with lowercase hex.
fn lowercase_hex_escapes(encoded: &[u8]) -> Vec<u8> {
    let mut out = encoded.to_vec();
    let mut i = 0;
    while i < out.len() {
        if out[i] == b'%' && i + 2 < out.len() {
            out[i + 1] = out[i + 1].to_ascii_lowercase();
            out[i + 2] = out[i + 2].to_ascii_lowercase();
            i += 3;
        } else {
            i += 1;
        }
    }
    out
}

/// The inside of a JSON string holding `text`, as the common encoders write it: serde and
/// JavaScript (only `"`, `\` and control bytes escaped), Python's default (`ensure_ascii`:
/// non-ASCII as `\uXXXX`), PHP's default (that, plus `/` as `\/`) and Go's
/// `encoding/json` (`<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`).
fn json_escapes(text: &str) -> Vec<Zeroizing<Vec<u8>>> {
    let mut serde = Zeroizing::new(String::with_capacity(text.len() + 8));
    let mut ascii = Zeroizing::new(String::with_capacity(text.len() + 8));
    let mut php = Zeroizing::new(String::with_capacity(text.len() + 8));
    let mut go = Zeroizing::new(String::with_capacity(text.len() + 8));
    for c in text.chars() {
        let common: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            _ => None,
        };
        if let Some(escape) = common {
            serde.push_str(escape);
            ascii.push_str(escape);
            php.push_str(escape);
            go.push_str(escape);
            continue;
        }
        if (c as u32) < 0x20 {
            let escape = format!("\\u{:04x}", c as u32);
            serde.push_str(&escape);
            ascii.push_str(&escape);
            php.push_str(&escape);
            go.push_str(&escape);
            continue;
        }
        if matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') {
            go.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            go.push(c);
        }
        serde.push(c);
        if c.is_ascii() {
            ascii.push(c);
            if c == '/' {
                php.push_str("\\/");
            } else {
                php.push(c);
            }
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let escape = format!("\\u{unit:04x}");
                ascii.push_str(&escape);
                php.push_str(&escape);
            }
        }
    }
    [serde, ascii, php, go]
        .into_iter()
        .map(|s| Zeroizing::new(s.as_bytes().to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::Delivery;

    const SIGIL: &str = "sigil-9d1e/+x?&=\"ü";

    fn scrubber(value: &str, placement: Placement) -> Scrubber {
        Scrubber::new(
            Some(&SecretValue::new(value.as_bytes().to_vec())),
            Some(&placement),
        )
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
        let s = Scrubber::new(None, Some(&Placement::Bearer));
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
