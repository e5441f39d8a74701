//! Property tests of the scrubber: any JSON spelling of a secret, in a body read whole
//! or a stream cut anywhere, or joined from deltas split anywhere, is redacted, and JSON
//! stays JSON.

use proptest::prelude::*;

use super::{Scrubber, StreamScrub};
use crate::secret::SecretValue;

/// How one character is written inside a JSON string.
#[derive(Debug, Clone, Copy)]
enum Spelt {
    Plain,
    Lower,
    Upper,
}

/// The inside of a JSON string holding `secret`, character `i` spelt `how[i % len]`.
fn spell(secret: &str, how: &[Spelt]) -> String {
    let mut out = String::new();
    for (i, c) in secret.chars().enumerate() {
        let escaped = |upper: bool| {
            let mut units = [0u16; 2];
            c.encode_utf16(&mut units)
                .iter()
                .map(|u| {
                    if upper {
                        format!("\\u{u:04X}")
                    } else {
                        format!("\\u{u:04x}")
                    }
                })
                .collect::<String>()
        };
        match how[i % how.len()] {
            Spelt::Lower => out.push_str(&escaped(false)),
            Spelt::Upper => out.push_str(&escaped(true)),
            Spelt::Plain => {
                let one = serde_json::Value::String(c.to_string()).to_string();
                let one = &one[1..one.len() - 1];
                // `/` may be written `\/`, as PHP does.
                out.push_str(if c == '/' { "\\/" } else { one });
            }
        }
    }
    out
}

fn spelt() -> impl Strategy<Value = Vec<Spelt>> {
    proptest::collection::vec(
        prop_oneof![Just(Spelt::Plain), Just(Spelt::Lower), Just(Spelt::Upper)],
        1..6,
    )
}

/// A secret of 4 to 20 characters of any kind, with no "[redacted]" inside.
fn secret() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 4..20)
        .prop_map(|chars| chars.into_iter().collect::<String>())
        .prop_filter("long enough to search for", |s| s.len() >= 8)
}

fn scrubber(secret: &str) -> Scrubber {
    let value = SecretValue::new(secret.as_bytes().to_vec());
    Scrubber::new(None, Some(("p", &value)))
}

/// True when `text`, JSON-decoded wherever it is JSON, holds `secret`.
fn leaks(text: &str, secret: &str) -> bool {
    text.contains(secret)
        || serde_json::from_str::<serde_json::Value>(text)
            .map(|v| v.to_string().contains(secret) || format!("{v:?}").contains(secret))
            .unwrap_or(false)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn any_json_spelling_read_in_chunks_cut_anywhere_is_redacted(
        secret in secret(),
        how in spelt(),
        cut in any::<prop::sample::Index>(),
    ) {
        let s = scrubber(&secret);
        let event = format!("{{\"text\":\"echo {} end\"}}", spell(&secret, &how));
        let body = format!("data: {event}\n\ndata: [DONE]\n\n");
        let bytes = body.as_bytes();
        let at = cut.index(bytes.len());
        let mut stream = StreamScrub::new(s.clone());
        let partial = stream.view(&bytes[..at]).into_owned();
        let whole = stream.view(bytes).into_owned();
        let whole = String::from_utf8(whole).unwrap();
        let line = whole.lines().next().unwrap().trim_start_matches("data: ");
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON after the cut: {e}: {whole}"));
        prop_assert!(!leaks(line, &secret), "{whole}");
        prop_assert!(value["text"].as_str().unwrap().contains("[redacted]"), "{whole}");
        // What the hook saw mid-stream holds no whole secret either.
        let partial = String::from_utf8_lossy(&partial);
        prop_assert!(!partial.contains(&secret));
        // The body read whole, as the caller gets it, is the same.
        let read_whole = String::from_utf8(s.bytes(bytes.to_vec())).unwrap();
        prop_assert_eq!(read_whole, whole);
    }

    #[test]
    fn a_secret_split_across_deltas_is_redacted_once_joined(
        secret in secret(),
        how in spelt(),
        cut in any::<prop::sample::Index>(),
    ) {
        let s = scrubber(&secret);
        let chars: Vec<char> = secret.chars().collect();
        let at = cut.index(chars.len() + 1);
        let first: String = chars[..at].iter().collect();
        let second: String = chars[at..].iter().collect();
        // Each delta as a JSON document, decoded as an assembler decodes it, then joined.
        let deltas = [first, second].map(|part| {
            let doc = format!("{{\"delta\":\"{}\"}}", spell(&part, &how));
            let value: serde_json::Value = serde_json::from_str(&doc).unwrap();
            value["delta"].as_str().unwrap().to_string()
        });
        let joined = format!("said: {}{} ok", deltas[0], deltas[1]);
        let clean = s.text(&joined);
        prop_assert!(!clean.contains(&secret), "{clean}");
        prop_assert_eq!(clean.as_ref(), "said: [redacted] ok");
    }
}

#[test]
fn a_cut_that_would_break_a_json_document_falls_back_to_redacting_each_string() {
    // The secret spans a string's end and the next key: cutting the raw range would
    // swallow the structure between them.
    let s = scrubber("ab\",\"cd-secret");
    let body = br#"{"x":"ab","cd-secret":1}"#.to_vec();
    let out = String::from_utf8(s.bytes(body)).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(&out).is_ok(),
        "{out}"
    );
}

#[test]
fn every_escape_in_a_json_body_keeps_it_json() {
    let s = scrubber("sk-live-0123456789");
    let body =
        r#"{"e":{"message":"bad \u0073\u006B-live-0123456789 and sk\u002Dlive-0123456789\n"}}"#;
    let out = s.text(body);
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["e"]["message"], "bad [redacted] and [redacted]\n");
}
