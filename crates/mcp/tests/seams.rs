//! M4: exactly three entry points take a cancellation signal. This reads the crate's
//! source, so it fails the day a fourth appears (or one of the three disappears).

use std::path::Path;

/// The public functions whose signature mentions a cancellation signal.
fn public_signal_takers() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for file in files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
    {
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
