//! No file over 800 lines and no function over 100 lines in the crates' sources (`src/`,
//! tests and benches aside): a room a person can hold. A new one fails the test; split it
//! by concept, or into named steps that read top to bottom.
//!
//! A function's length is the lines from its `fn NAME` to the brace that closes its body,
//! both included, found by matching braces in code whose comments and literals are blanked
//! (`rust_source.rs`). Its limits: a `fn` a macro generates is not seen; a closure is part
//! of its function; a declaration without a body (a trait's) is skipped; an item nested
//! in a function is counted both on its own and as part of its function.

use std::path::PathBuf;

use super::rust_source::{closing_brace, code_only, line_of, rust_files};

const FILE_LINES: usize = 800;
const FUNCTION_LINES: usize = 100;

/// Every function with a body in `text`: (name, first line, lines).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let name: String = code[at + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue; // `fn(u8) -> u8`, a pointer type
        }
        // The body opens at the first `{` outside the signature's brackets, unless a `;`
        // ends a declaration first.
        let mut depth = 0i32;
        let mut open = None;
        for (offset, &b) in bytes[at..].iter().enumerate() {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    open = Some(at + offset);
                    break;
                }
                _ => {}
            }
        }
        let Some(close) = open.and_then(|open| closing_brace(bytes, open)) else {
            continue;
        };
        let first = line_of(&code, at);
        found.push((name, first, line_of(&code, close) - first + 1));
    }
    found
}

/// Every source file of the crates (`src/` only), relative to the workspace.
fn sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    for (_, src) in super::crate_sources() {
        files.extend(rust_files(&src));
    }
    let workspace = super::workspace().canonicalize().unwrap();
    files
        .into_iter()
        .map(|(path, text)| {
            let path = path.canonicalize().unwrap();
            (path.strip_prefix(&workspace).unwrap().to_path_buf(), text)
        })
        .collect()
}

#[test]
fn architecture_no_file_is_over_800_lines_and_no_function_over_100() {
    let (mut files, mut long, mut scanned) = (Vec::new(), Vec::new(), 0);
    for (path, text) in sources() {
        let lines = text.lines().count();
        if lines > FILE_LINES {
            files.push(format!("{lines:>5}  {}", path.display()));
        }
        for (name, line, length) in functions(&text) {
            scanned += 1;
            if length > FUNCTION_LINES {
                long.push(format!("{length:>5}  {}:{line} {name}", path.display()));
            }
        }
    }
    // The workspace has thousands of functions: far fewer means the scan missed the sources.
    assert!(
        scanned > 2_000,
        "only {scanned} functions found: did the scan miss the sources?"
    );
    assert!(
        files.is_empty(),
        "{} files over {FILE_LINES} lines: split each by concept\n{}",
        files.len(),
        files.join("\n")
    );
    assert!(
        long.is_empty(),
        "{} functions over {FUNCTION_LINES} lines: split each into named steps\n{}",
        long.len(),
        long.join("\n")
    );
}

#[test]
fn architecture_function_lengths_run_from_fn_to_the_closing_brace() {
    let text = "trait T { fn declared(&self); }\n\
                fn outer(x: [u8; 2]) -> Box<dyn Fn(u8)> {\n    \
                    let s = \"}\"; // }\n    \
                    fn inner() {}\n    \
                    Box::new(|_| {})\n\
                }\n";
    let found = functions(text);
    assert_eq!(
        found,
        [("outer".to_owned(), 2, 5), ("inner".to_owned(), 4, 1)]
    );
}
