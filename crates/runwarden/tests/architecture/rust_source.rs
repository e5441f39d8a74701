//! Just enough of Rust's lexical rules to measure the workspace's shape by scanning text:
//! comments, string and character literals blanked, `#[cfg(test)]` items dropped, braces
//! matched. Not a parser: it does not expand macros, resolve glob imports or understand
//! `#[path]`; the tests built on it say what that costs them.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, with its path and text, in a stable order.
pub(super) fn rust_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    out.sort();
    out
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// `text` with every comment removed and every string or character literal replaced by an
/// empty one (`""`, `' '`). Newlines are kept, so line numbers stay true, and so are
/// braces outside literals, so they can be matched.
pub(super) fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    // What was skipped is replaced by its newlines.
    let newlines = |from: usize, to: usize, out: &mut Vec<u8>| {
        let count = bytes[from..to.min(bytes.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        out.extend(std::iter::repeat_n(b'\n', count));
    };
    while i < bytes.len() {
        let rest = &bytes[i..];
        let after_ident = i > 0 && is_ident(bytes[i - 1]);
        if rest.starts_with(b"//") {
            i += rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        } else if rest.starts_with(b"/*") {
            // Block comments nest.
            let (mut depth, mut j) = (0, i);
            while j < bytes.len() {
                if bytes[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if bytes[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            newlines(i, j, &mut out);
            i = j;
        } else if let Some(end) = raw_string_end(bytes, i).filter(|_| !after_ident) {
            out.extend_from_slice(b"\"\"");
            newlines(i, end, &mut out);
            i = end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.extend_from_slice(b"\"\"");
            newlines(i, j, &mut out);
            i = j + 1;
        } else if let Some(end) = char_literal_end(bytes, i) {
            out.extend_from_slice(b"' '");
            i = end;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    // Only whole literals and comments were cut, each at an ASCII delimiter.
    String::from_utf8(out).unwrap()
}

/// Where the raw string (`r"..."`, `br#"..."#`) starting at `at` ends, if one does.
fn raw_string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let start = if bytes[at] == b'b' { at + 1 } else { at };
    if bytes.get(start) != Some(&b'r') {
        return None;
    }
    let hashes = bytes[start + 1..]
        .iter()
        .take_while(|&&b| b == b'#')
        .count();
    let open = start + 1 + hashes;
    if bytes.get(open) != Some(&b'"') {
        return None; // `r#type` is a raw identifier, `r` a name
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = &bytes[open + 1..];
    let end = body
        .windows(close.len())
        .position(|w| w == close.as_slice())?;
    Some(open + 1 + end + close.len())
}

/// Where the character literal (`'x'`, `'\n'`, `'é'`) starting at `at` ends; `None` for a
/// lifetime (`'a`) or anything else.
fn char_literal_end(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes[at] != b'\'' {
        return None;
    }
    if bytes.get(at + 1) == Some(&b'\\') {
        let close = bytes[at + 2..].iter().take(10).position(|&b| b == b'\'')?;
        return Some(at + 2 + close + 1);
    }
    // One character, whatever its UTF-8 length, then the closing quote.
    let width = match bytes.get(at + 1)? {
        b if *b < 0x80 => 1,
        b if *b >= 0xF0 => 4,
        b if *b >= 0xE0 => 3,
        _ => 2,
    };
    (bytes.get(at + 1 + width) == Some(&b'\'')).then_some(at + 2 + width)
}

/// The index of the `}` that closes the `{` at `open` in code from [`code_only`].
pub(super) fn closing_brace(code: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (at, &b) in code.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

/// `code` (from [`code_only`]) without its `#[cfg(test)]` items: the attribute through the
/// item's `;` or its closing brace, newlines kept. A unit test's imports are, like a
/// dev-dependency, no part of the module's structure.
pub(super) fn without_tests(code: &str) -> String {
    let mut code = code.to_owned();
    while let Some(at) = code.find("#[cfg(test)]") {
        let bytes = code.as_bytes();
        let Some(stop) = bytes[at..].iter().position(|&b| b == b'{' || b == b';') else {
            break;
        };
        let stop = at + stop;
        let end = if bytes[stop] == b';' {
            stop
        } else {
            closing_brace(bytes, stop).unwrap_or(bytes.len() - 1)
        };
        let kept = "\n".repeat(code[at..=end].matches('\n').count());
        code.replace_range(at..=end, &kept);
    }
    code
}

/// The 1-based line of byte `at`.
pub(super) fn line_of(code: &str, at: usize) -> usize {
    code.as_bytes()[..at]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[test]
fn architecture_scanner_blanks_comments_and_literals_and_keeps_lines() {
    let text = "let a = \"crate::x // {\"; // crate::y\n/* crate::z /* nested */\n */ \
                let b = r#\"crate::w\"#; let c = '{'; fn f<'a>(s: &'a str) {}\n";
    let code = code_only(text);
    assert!(!code.contains("crate::"), "{code}");
    assert_eq!(code.lines().count(), text.lines().count());
    assert!(code.contains("fn f<'a>(s: &'a str) {}"), "{code}");
    let tests = without_tests("use a;\n#[cfg(test)]\nmod tests {\n use b;\n}\nuse c;\n");
    assert_eq!(tests, "use a;\n\n\n\n\nuse c;\n");
}
