//! Files over 800 lines and functions over 100 lines in the crates' sources (`src/`, tests
//! and benches aside), measured: the counts may only fall. The structure work lowers the
//! ceilings as it splits them.
//!
//! A function's length is the lines from its `fn NAME` to the brace that closes its body,
//! both included, found by matching braces in code whose comments and literals are blanked
//! (`rust_source.rs`). Its limits: a `fn` a macro generates is not seen; a closure is part
//! of its function; a declaration without a body (a trait's) is skipped; an item nested
//! in a function is counted both on its own and as part of its function.

use std::path::PathBuf;

use super::rust_source::{closing_brace, code_only, line_of, rust_files};

/// Files over 800 lines today. Lower it when one is split; never raise it.
const FILES_CEILING: usize = 11;
/// Functions over 100 lines today. Lower it when one is split; never raise it.
const FUNCTIONS_CEILING: usize = 21;

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
fn architecture_files_over_800_lines_and_functions_over_100_are_no_more_than_today() {
    let mut files = Vec::new();
    let mut functions_found = Vec::new();
    for (path, text) in sources() {
        let lines = text.lines().count();
        if lines > FILE_LINES {
            files.push((lines, path.display().to_string()));
        }
        for (name, line, length) in functions(&text) {
            if length > FUNCTION_LINES {
                functions_found.push((length, format!("{}:{line} {name}", path.display())));
            }
        }
    }
    assert!(
        !functions_found.is_empty() || FUNCTIONS_CEILING == 0,
        "no long function found: did the scan miss the sources?"
    );
    let list = |found: &mut Vec<(usize, String)>| {
        found.sort_by(|a, b| b.cmp(a));
        let lines: Vec<String> = found
            .iter()
            .map(|(n, at)| format!("{n:>5}  {at}"))
            .collect();
        lines.join("\n")
    };
    let (files_list, functions_list) = (list(&mut files), list(&mut functions_found));
    println!(
        "{} files over {FILE_LINES} lines:\n{files_list}",
        files.len()
    );
    println!(
        "{} functions over {FUNCTION_LINES} lines:\n{functions_list}",
        functions_found.len()
    );
    assert!(
        files.len() <= FILES_CEILING,
        "{} files over {FILE_LINES} lines, more than the {FILES_CEILING} allowed: split the new \
         one by concept\n{files_list}",
        files.len()
    );
    assert!(
        functions_found.len() <= FUNCTIONS_CEILING,
        "{} functions over {FUNCTION_LINES} lines, more than the {FUNCTIONS_CEILING} allowed: \
         split the new one\n{functions_list}",
        functions_found.len()
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
