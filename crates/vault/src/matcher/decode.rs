//! Decoded views of text a server sent: JSON string escapes and percent-encoding undone,
//! each byte remembering which bytes of the original it came from.
//!
//! The matcher searches these views for a secret's forms and maps every match back to a
//! range of the original text that covers whole escapes, so cutting that range out and
//! writing `[redacted]` in its place leaves a JSON string a JSON string.

/// Text with escapes undone, and for each of its bytes the offset in the original text
/// where the escape (or literal byte) that produced it starts.
pub(crate) struct View {
    /// The decoded bytes.
    pub(crate) bytes: Vec<u8>,
    /// `origin[i]` is where byte `i` starts in the original; one more entry, the
    /// original's length, closes the last byte.
    origin: Vec<u32>,
}

impl View {
    /// The original range a match `start..end` of this view came from: from the start of
    /// the escape that produced its first byte to the end of the escape that produced its
    /// last byte.
    pub(crate) fn original(&self, start: usize, end: usize) -> (usize, usize) {
        let first = self.origin[start] as usize;
        // Bytes of one decoded character share an origin: step past the last byte's
        // siblings to the next escape, whose start is where this one ends.
        let last = self.origin[end - 1];
        let mut next = end;
        while next < self.bytes.len() && self.origin[next] == last {
            next += 1;
        }
        (first, self.origin[next] as usize)
    }
}

/// Where byte `at` of `from` (a view, or the original when `None`) starts in the original.
fn origin_of(from: Option<&View>, at: usize) -> u32 {
    match from {
        Some(view) => view.origin[at],
        // The original is at most 4 GiB: responses are capped far below that.
        None => at as u32,
    }
}

fn closing(from: Option<&View>, len: usize) -> u32 {
    match from {
        Some(view) => view.origin[len],
        None => len as u32,
    }
}

fn hex(b: u8) -> Option<u32> {
    (b as char).to_digit(16)
}

fn hex4(bytes: &[u8]) -> Option<u32> {
    if bytes.len() < 4 {
        return None;
    }
    bytes[..4]
        .iter()
        .try_fold(0u32, |acc, &b| Some(acc * 16 + hex(b)?))
}

/// `text` with every JSON string escape undone: `\"`, `\\`, `\/`, `\b`, `\f`, `\n`,
/// `\r`, `\t` and `\uXXXX` in either hex case, a surrogate pair as one character, a lone
/// surrogate as U+FFFD. A backslash that starts no escape stays. `None` when `text` holds
/// no escape, so the caller skips a view identical to the one it has.
pub(crate) fn json_unescaped(text: &[u8], from: Option<&View>) -> Option<View> {
    memchr::memchr(b'\\', text)?;
    let mut bytes = Vec::with_capacity(text.len());
    let mut origin = Vec::with_capacity(text.len() + 1);
    let mut decoded_any = false;
    let mut i = 0;
    while i < text.len() {
        let at = origin_of(from, i);
        if text[i] != b'\\' || i + 1 >= text.len() {
            bytes.push(text[i]);
            origin.push(at);
            i += 1;
            continue;
        }
        let simple = match text[i + 1] {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(b) = simple {
            bytes.push(b);
            origin.push(at);
            decoded_any = true;
            i += 2;
            continue;
        }
        let Some(unit) = (text[i + 1] == b'u')
            .then(|| hex4(&text[i + 2..]))
            .flatten()
        else {
            bytes.push(b'\\');
            origin.push(at);
            i += 1;
            continue;
        };
        let (c, used) = match unit {
            0xD800..=0xDBFF => {
                let low = text
                    .get(i + 6..i + 8)
                    .filter(|p| *p == b"\\u")
                    .and_then(|_| hex4(&text[i + 8..]))
                    .filter(|low| (0xDC00..=0xDFFF).contains(low));
                match low {
                    Some(low) => {
                        let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        (char::from_u32(code).unwrap_or('\u{fffd}'), 12)
                    }
                    None => ('\u{fffd}', 6),
                }
            }
            _ => (char::from_u32(unit).unwrap_or('\u{fffd}'), 6),
        };
        let mut utf8 = [0u8; 4];
        for &b in c.encode_utf8(&mut utf8).as_bytes() {
            bytes.push(b);
            origin.push(at);
        }
        decoded_any = true;
        i += used;
    }
    origin.push(closing(from, text.len()));
    decoded_any.then_some(View { bytes, origin })
}

/// `text` with every `%XX` undone (either hex case), and with `plus_as_space` every `+` a
/// space as form encoding writes it. `None` when nothing was decoded.
pub(crate) fn percent_decoded(
    text: &[u8],
    from: Option<&View>,
    plus_as_space: bool,
) -> Option<View> {
    let has_percent = memchr::memchr(b'%', text).is_some();
    let has_plus = plus_as_space && memchr::memchr(b'+', text).is_some();
    if !has_percent && !has_plus {
        return None;
    }
    let mut bytes = Vec::with_capacity(text.len());
    let mut origin = Vec::with_capacity(text.len() + 1);
    let mut decoded_any = false;
    let mut i = 0;
    while i < text.len() {
        let at = origin_of(from, i);
        let escaped = match text[i] {
            b'%' => text
                .get(i + 1..i + 3)
                .and_then(|h| Some(hex(h[0])? * 16 + hex(h[1])?)),
            _ => None,
        };
        if let Some(b) = escaped {
            bytes.push(b as u8);
            origin.push(at);
            decoded_any = true;
            i += 3;
        } else if plus_as_space && text[i] == b'+' {
            bytes.push(b' ');
            origin.push(at);
            decoded_any = true;
            i += 1;
        } else {
            bytes.push(text[i]);
            origin.push(at);
            i += 1;
        }
    }
    origin.push(closing(from, text.len()));
    decoded_any.then_some(View { bytes, origin })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(view: &View) -> String {
        String::from_utf8_lossy(&view.bytes).into_owned()
    }

    #[test]
    fn every_json_escape_form_decodes_and_maps_back_to_whole_escapes() {
        let text = br#"a\u0062\u00E9\ud83d\ude00\/\"\\x\q"#;
        let view = json_unescaped(text, None).unwrap();
        assert_eq!(decoded(&view), "abé😀/\"\\x\\q");
        // "b" came from `\u0062`: bytes 1..7 of the original.
        assert_eq!(view.original(1, 2), (1, 7));
        // The emoji's four bytes map to the whole surrogate pair.
        let emoji = decoded(&view).find('😀').unwrap();
        assert_eq!(view.original(emoji, emoji + 4), (13, 25));
        assert_eq!(view.original(0, view.bytes.len()), (0, text.len()));
    }

    #[test]
    fn a_lone_surrogate_is_a_replacement_character_and_plain_text_has_no_view() {
        let view = json_unescaped(br#"x\ud800y"#, None).unwrap();
        assert_eq!(decoded(&view), "x\u{fffd}y");
        assert!(json_unescaped(b"no escapes", None).is_none());
        assert!(json_unescaped(br"\z", None).is_none(), "nothing decoded");
    }

    #[test]
    fn percent_decoding_composes_with_json_decoding() {
        let text = br#"k=\u0025%41%2fb+c"#;
        let json = json_unescaped(text, None).unwrap();
        assert_eq!(decoded(&json), "k=%%41%2fb+c");
        let both = percent_decoded(&json.bytes, Some(&json), true).unwrap();
        assert_eq!(decoded(&both), "k=%A/b c");
        // "A" came from `%41`, which sits right after the six-byte `\u0025`.
        let a = decoded(&both).find('A').unwrap();
        assert_eq!(both.original(a, a + 1), (8, 11));
        assert!(percent_decoded(b"a+b", None, false).is_none());
    }
}
