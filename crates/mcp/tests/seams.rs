//! M4: exactly three entry points take a cancellation signal. This reads the crate's
//! source, so it fails the day a fourth appears (or one of the three disappears).

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, its module directories (the client's `client/`) included.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The public functions whose signature mentions a cancellation signal.
fn public_signal_takers() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let files = rust_files(&src);
    assert!(
        files.iter().any(|f| f.ends_with("client/calls.rs")),
        "the scan must reach the client's files: {files:?}"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        // Join each signature onto one line: from `pub fn`/`pub async fn` to its `{`.
        let mut rest = text.as_str();
        while let Some(at) = rest.find("pub ") {
            rest = &rest[at + 4..];
            let signature_start = rest.trim_start_matches("async ");
            if !signature_start.starts_with("fn ") {
                continue;
            }
            let end = rest.find('{').unwrap_or(rest.len());
            let signature = &rest[..end];
            if signature.contains("CancellationSignal") {
                let name = signature_start[3..]
                    .split(['(', '<'])
                    .next()
                    .unwrap()
                    .trim()
                    .to_string();
                found.push(name);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn exactly_three_entry_points_take_a_signal() {
    assert_eq!(
        public_signal_takers(),
        ["call_tool", "send_notification", "send_request"]
    );
}
