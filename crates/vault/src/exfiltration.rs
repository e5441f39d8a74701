//! No secret leaves for a host it does not belong to: the check of an outbound request's
//! URL, headers and body for the value of any secret the vault holds.

use std::borrow::Cow;
use std::sync::Arc;

use crate::matcher::SecretMatcher;
use crate::scrub::Scrubber;

/// The names of the secrets whose value (in any spelling the matcher decodes) is in the
/// request's URL, a header name or value, or the body, sorted and each once; `allowed`
/// names the secrets the OAuth client puts in a token request on purpose.
///
/// The credential placed on this request is placed after this check, where its
/// placement says: found anywhere in what the caller wrote, it is leaving by another
/// way (a model that copied its own key into a tool's arguments).
pub(crate) fn carried_secrets(
    scrubber: &Scrubber,
    url: &str,
    headers: &[(String, String)],
    body: Option<&[u8]>,
    allowed: &[String],
) -> Vec<String> {
    let mut texts: Vec<&[u8]> = vec![url.as_bytes()];
    for (name, value) in headers {
        texts.push(name.as_bytes());
        texts.push(value.as_bytes());
    }
    texts.extend(body);
    let mut names: Vec<String> = Vec::new();
    for matcher in scrubber.matchers() {
        for text in &texts {
            for hit in matcher.hits(text, false) {
                let name = matcher.name(hit.secret);
                if !allowed.iter().any(|a| a == name) && !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            }
        }
    }
    names.sort();
    names
}

/// What a caller outside the vault uses to cut every stored secret out of text it
/// assembled itself: a model's streamed deltas joined into one answer, a server's
/// catalogue. Holds no secret it could print: `Debug` shows how many it searches for.
#[derive(Clone)]
pub struct Redactor {
    scrubber: Scrubber,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").finish_non_exhaustive()
    }
}

impl Redactor {
    pub(crate) fn new(matcher: Arc<SecretMatcher>) -> Self {
        Self {
            scrubber: Scrubber::new(Some(matcher), None),
        }
    }

    /// A redactor that finds nothing (a caller with no vault, such as a scripted model).
    pub fn none() -> Self {
        Self {
            scrubber: Scrubber::none(),
        }
    }

    /// `text` with every secret in it replaced by `[redacted]`, decoded as the
    /// scrubber decodes; borrowed when there is none.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.scrubber.text(text)
    }

    /// Every string and key of `value` redacted in place; true when something was.
    pub fn value(&self, value: &mut serde_json::Value) -> bool {
        self.scrubber.value(value)
    }

    /// The names of the secrets whose value `value` holds in any string or key (as a
    /// whole string, JSON in a string, escaped or percent-encoded), sorted, each once.
    pub fn secrets_in(&self, value: &serde_json::Value) -> Vec<String> {
        self.secrets_in_text(&value.to_string())
    }

    /// The names of the secrets whose value `text` holds in any spelling the scrubber
    /// decodes, sorted, each once: the check every outbound request's body gets.
    pub fn secrets_in_text(&self, text: &str) -> Vec<String> {
        carried_secrets(&self.scrubber, "", &[], Some(text.as_bytes()), &[])
    }
}
