//! One multi-pattern matcher over every form of many secrets, searching text in what it
//! means: as sent, with JSON escapes undone (once and twice), and percent-decoded.

mod decode;

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine;
use zeroize::Zeroizing;

use decode::{View, json_unescaped, percent_decoded};

/// Forms shorter than this are not searched for. A 1 to 3 byte form (a tiny password)
/// matches ordinary text everywhere ("true", a JSON key, a digit run), so redacting it
/// would shred the protocol while protecting nothing an attacker could not guess; the
/// longer forms that contain it (`user:password`, its base64) are still cut.
pub(crate) const MIN_FORM_LEN: usize = 4;

/// One occurrence of a secret in a text: the range of the text as given, and which
/// secret (an index into the names the matcher was built with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) secret: usize,
}

/// Every form of a set of secrets, compiled once into an Aho-Corasick automaton.
///
/// The forms of a value are the ones a server can echo of what the vault placed: the
/// value itself, its base64 (what `Basic` sends for `user:password`), and the part after
/// the first colon (the password alone). Escaped spellings are not forms: the text is
/// decoded instead (see [`SecretMatcher::hits`]), so every spelling of every character
/// is found, not just the ones some encoder writes.
///
/// The form list is wiped as soon as the automaton is built; the automaton's own tables
/// cannot be, so a matcher lives as long as the secrets it was built from are unchanged.
/// It prints no form in `Debug`.
pub(crate) struct SecretMatcher {
    names: Vec<String>,
    /// Pattern id to secret index.
    owner: Vec<usize>,
    exact: Option<AhoCorasick>,
    folded: Option<AhoCorasick>,
    /// Some form holds a space, so form encoding's `+` is decoded too.
    plus_as_space: bool,
    /// Keyed hashes of every proper prefix of every form at least [`MIN_FORM_LEN`] long:
    /// what finds the start of a secret at the end of a body cut at its size limit,
    /// without keeping the forms themselves.
    prefixes: HashSet<u64>,
    hasher: RandomState,
    longest: usize,
}

impl std::fmt::Debug for SecretMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretMatcher")
            .field("secrets", &self.names.len())
            .field("forms", &self.owner.len())
            .finish_non_exhaustive()
    }
}

/// The forms of one value, longest-lived first.
fn forms_of(value: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    if value.len() < MIN_FORM_LEN {
        return Vec::new();
    }
    let mut forms = vec![Zeroizing::new(value.to_vec())];
    let encoded = base64::engine::general_purpose::STANDARD.encode(value);
    forms.push(Zeroizing::new(encoded.into_bytes()));
    if let Some(at) = value.iter().position(|&b| b == b':') {
        forms.push(Zeroizing::new(value[at + 1..].to_vec()));
    }
    forms.retain(|f| f.len() >= MIN_FORM_LEN);
    forms
}

impl SecretMatcher {
    /// A matcher over `secrets`, each a name (never secret) and its value.
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = (String, &'a [u8])>) -> Self {
        let mut names = Vec::new();
        let mut owner = Vec::new();
        let mut forms: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for (index, (name, value)) in secrets.into_iter().enumerate() {
            names.push(name);
            for form in forms_of(value) {
                owner.push(index);
                forms.push(form);
            }
        }
        let plus_as_space = forms.iter().any(|f| f.contains(&b' '));
        let hasher = RandomState::new();
        let prefixes = forms
            .iter()
            .flat_map(|f| (MIN_FORM_LEN..f.len()).map(|n| hasher.hash_one(&f[..n])))
            .collect();
        let longest = forms.iter().map(|f| f.len()).max().unwrap_or(0);
        let build = |fold: bool| {
            if forms.is_empty() {
                return None;
            }
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .ascii_case_insensitive(fold)
                .build(forms.iter().map(|f| f.as_slice()))
                .ok()
        };
        let exact = build(false);
        let folded = build(true);
        // `forms` is dropped here, each entry zeroized.
        Self {
            names,
            owner,
            exact,
            folded,
            plus_as_space,
            prefixes,
            hasher,
            longest,
        }
    }

    /// Where the longest tail of `text` that is the start of a form (at least
    /// [`MIN_FORM_LEN`] bytes of it, as sent or with JSON escapes undone) begins.
    pub(crate) fn partial_tail(&self, text: &[u8]) -> Option<usize> {
        if self.prefixes.is_empty() {
            return None;
        }
        let in_bytes = |bytes: &[u8]| {
            (MIN_FORM_LEN..self.longest.min(bytes.len() + 1))
                .rev()
                .find(|&n| {
                    self.prefixes
                        .contains(&self.hasher.hash_one(&bytes[bytes.len() - n..]))
                })
                .map(|n| bytes.len() - n)
        };
        let raw = in_bytes(text);
        // A form spelt with escapes takes up to 12 bytes a character.
        let window = text.len().saturating_sub(self.longest * 12);
        let decoded = json_unescaped(&text[window..], None).and_then(|view| {
            let at = in_bytes(&view.bytes)?;
            Some(window + view.original(at, at + 1).0)
        });
        match (raw, decoded) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// True when there is nothing to look for.
    pub(crate) fn is_empty(&self) -> bool {
        self.exact.is_none()
    }

    /// The name of secret `index`.
    pub(crate) fn name(&self, index: usize) -> &str {
        &self.names[index]
    }

    /// The views of `text` worth searching: JSON escapes undone once and twice (a JSON
    /// document inside a JSON string, as MCP text results often carry), each also
    /// percent-decoded. A view is built only when its decoder finds something to undo.
    fn views(&self, text: &[u8]) -> Vec<View> {
        let mut views: Vec<View> = Vec::new();
        if let Some(once) = json_unescaped(text, None) {
            if let Some(twice) = json_unescaped(&once.bytes, Some(&once)) {
                views.push(twice);
            }
            views.push(once);
        }
        let mut decoded = Vec::new();
        for plus in [false, true] {
            if plus && !self.plus_as_space {
                continue;
            }
            decoded.extend(percent_decoded(text, None, plus));
            for view in &views {
                decoded.extend(percent_decoded(&view.bytes, Some(view), plus));
            }
        }
        views.extend(decoded);
        views
    }

    /// Every occurrence of a form in `text`, searched in every view and given as ranges
    /// of `text` itself. With `fold`, ASCII case is ignored (a redirect target, whose
    /// host a parser lowercases).
    pub(crate) fn hits(&self, text: &[u8], fold: bool) -> Vec<Hit> {
        let automaton = if fold { &self.folded } else { &self.exact };
        let Some(automaton) = automaton else {
            return Vec::new();
        };
        let mut hits = Vec::new();
        let mut search = |bytes: &[u8], view: Option<&View>| {
            for found in automaton.find_overlapping_iter(bytes) {
                let (start, end) = match view {
                    Some(view) => view.original(found.start(), found.end()),
                    None => (found.start(), found.end()),
                };
                hits.push(Hit {
                    start,
                    end,
                    secret: self.owner[found.pattern().as_usize()],
                });
            }
        };
        search(text, None);
        for view in self.views(text) {
            search(&view.bytes, Some(&view));
        }
        hits
    }
}

/// The hits of several matchers as disjoint ranges of `text`, in order.
pub(crate) fn merged_ranges(hits: impl IntoIterator<Item = Hit>) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = hits.into_iter().map(|h| (h.start, h.end)).collect();
    ranges.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start < last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(values: &[(&str, &str)]) -> SecretMatcher {
        SecretMatcher::new(values.iter().map(|(n, v)| (n.to_string(), v.as_bytes())))
    }

    fn names(m: &SecretMatcher, text: &str) -> Vec<String> {
        let mut found: Vec<String> = m
            .hits(text.as_bytes(), false)
            .into_iter()
            .map(|h| m.name(h.secret).to_string())
            .collect();
        found.sort();
        found.dedup();
        found
    }

    #[test]
    fn each_secret_is_found_by_name_in_every_decoded_spelling() {
        let m = matcher(&[("model-key", "sk-live-abcd"), ("basic", "svc:hunter22")]);
        assert_eq!(names(&m, "x sk-live-abcd y"), ["model-key"]);
        assert_eq!(names(&m, r#"{"a":"\u0073k-live-abcd"}"#), ["model-key"]);
        assert_eq!(
            names(
                &m,
                r#"{"a":"\u0073\u006B\u002d\u006c\u0069\u0076\u0065\u002d\u0061\u0062\u0063\u0064"}"#
            ),
            ["model-key"]
        );
        assert_eq!(
            names(&m, r#"{"t":"{\"a\":\"\\u0073k-live-abcd\"}"}"#),
            ["model-key"],
            "JSON in a JSON string"
        );
        assert_eq!(names(&m, "q=sk%2dlive%2Dabcd"), ["model-key"]);
        assert_eq!(names(&m, "pw hunter22"), ["basic"]);
        let b64 = base64::engine::general_purpose::STANDARD.encode("svc:hunter22");
        assert_eq!(names(&m, &format!("Basic {b64}")), ["basic"]);
        assert!(names(&m, "sk-live-abc d hunter2").is_empty());
    }

    #[test]
    fn a_hit_in_a_view_covers_whole_escapes_of_the_original() {
        let m = matcher(&[("k", "abcd")]);
        let text = r#"["x\u0061bc\u0064y"]"#;
        let hits = m.hits(text.as_bytes(), false);
        assert_eq!(hits.len(), 1);
        assert_eq!(&text[hits[0].start..hits[0].end], r"\u0061bc\u0064");
    }

    #[test]
    fn a_space_in_a_secret_is_found_form_encoded() {
        let m = matcher(&[("k", "two words")]);
        assert_eq!(names(&m, "v=two+words"), ["k"]);
        let plain = matcher(&[("k", "a+b+c+d")]);
        assert_eq!(
            names(&plain, "v=a+b+c+d"),
            ["k"],
            "the raw text still counts"
        );
    }

    #[test]
    fn nothing_to_find_and_debug_shows_counts_only() {
        let m = matcher(&[("tiny", "abc")]);
        assert!(m.is_empty());
        assert!(m.hits(b"abc", false).is_empty());
        let m = matcher(&[("k", "sk-live-abcd")]);
        let shown = format!("{m:?}");
        assert!(!shown.contains("sk-live"), "{shown}");
        assert!(shown.contains("secrets: 1"), "{shown}");
    }
}
