//! The invariants of ARCHITECTURE.md that are about the shape of the code, and the
//! documents that describe it: each reads the workspace's manifests, sources or documents,
//! so it fails the day the shape changes or a document stops matching it.

use std::path::{Path, PathBuf};

mod crate_layers;
mod import_circles;
mod rust_source;
mod sizes;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each crate's name (its folder under `crates/`) and its `src/` folder, in name order.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let mut crates: Vec<(String, PathBuf)> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("src").is_dir())
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                path.join("src"),
            )
        })
        .collect();
    crates.sort();
    crates
}

/// The names in a crate's `[dependencies]` table (not dev- or build-dependencies).
fn dependencies(krate: &str) -> Vec<String> {
    let manifest =
        std::fs::read_to_string(workspace().join("crates").join(krate).join("Cargo.toml")).unwrap();
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            names.push(
                line.split(['=', '.', ' '])
                    .next()
                    .unwrap()
                    .trim()
                    .to_string(),
            );
        }
    }
    names
}

fn sources(krate: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &workspace().join("crates").join(krate).join("src"),
        &mut out,
    );
    out
}

const LIBRARIES: [&str; 7] = [
    "vault",
    "oauth",
    "mcp",
    "models",
    "runtime",
    "store-sqlite",
    "runwarden",
];

#[test]
fn only_the_vault_depends_on_an_http_client() {
    for krate in LIBRARIES {
        let http: Vec<String> = dependencies(krate)
            .into_iter()
            .filter(|d| ["reqwest", "hyper", "hyper-util", "ureq", "isahc"].contains(&d.as_str()))
            .collect();
        if krate == "vault" {
            assert_eq!(http, ["reqwest"], "the vault's one HTTP client");
        } else if krate == "runwarden" {
            // The CLI's `--server` client: it reaches only the operator's own server, and
            // only from `client.rs`. hyper and hyper-util serve the API (`serve`'s accept
            // loop in `http/listener.rs`), with their server features only: no client.
            assert_eq!(http, ["reqwest", "hyper", "hyper-util"]);
            let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
            for line in manifest.lines().filter(|l| l.starts_with("hyper")) {
                assert!(!line.contains("client"), "a server-only hyper: {line}");
            }
            for (path, text) in sources("runwarden") {
                if path.file_name().is_some_and(|n| n != "client.rs") {
                    assert!(
                        !text.contains("reqwest::"),
                        "{}: only client.rs may use reqwest",
                        path.display()
                    );
                }
            }
        } else {
            assert!(
                http.is_empty(),
                "{krate} depends on {http:?}: every byte must go through the vault"
            );
        }
    }
}

#[test]
fn the_vault_and_the_mcp_client_know_nothing_about_runs_or_stores() {
    // Every crate may use the base crate (the store error, the clock, one-line text).
    for (krate, allowed) in [
        ("vault", &["runwarden-base"][..]),
        ("oauth", &["runwarden-base", "runwarden-vault"][..]),
        (
            "mcp",
            &["runwarden-base", "runwarden-vault", "runwarden-oauth"][..],
        ),
        ("models", &["runwarden-base", "runwarden-vault"][..]),
    ] {
        let beyond: Vec<String> = dependencies(krate)
            .into_iter()
            .filter(|d| d.starts_with("runwarden") && !allowed.contains(&d.as_str()))
            .collect();
        assert!(
            beyond.is_empty(),
            "{krate} may use {allowed:?} and nothing else of ours, but uses {beyond:?}"
        );
    }
}

/// The vault methods that open a sealed record for its own layer: a secret for a token
/// endpoint or a client assertion, a token or binding record.
const SEALED_RECORD_USE: [&str; 4] = [
    ".secret_use(",
    ".internal_get(",
    ".internal_put(",
    ".internal_delete(",
];

#[test]
fn only_the_vault_and_the_oauth_client_open_sealed_records() {
    let mut seen = 0;
    for (krate, _) in crate_sources() {
        for (path, text) in sources(&krate) {
            let code = rust_source::code_only(&text);
            for call in SEALED_RECORD_USE {
                if !code.contains(call) {
                    continue;
                }
                seen += 1;
                assert!(
                    krate == "vault" || krate == "oauth",
                    "{}: `{call}` outside the vault and the OAuth client; name the secret and \
                     let the egress client place it",
                    path.display()
                );
            }
        }
    }
    assert!(
        seen >= 4,
        "only {seen} uses found: did the methods get new names?"
    );
}

#[test]
fn store_backends_depend_on_the_seams_never_the_other_way_round() {
    for krate in ["vault", "mcp", "models", "runtime"] {
        assert!(
            !dependencies(krate)
                .iter()
                .any(|d| d.starts_with("runwarden-store")),
            "{krate} must not depend on a store backend"
        );
    }
}

#[test]
fn the_runtime_contains_no_sql() {
    for (path, text) in sources("runtime") {
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            for keyword in [
                "SELECT ",
                "UPDATE ",
                "INSERT ",
                "DELETE FROM",
                "BEGIN IMMEDIATE",
            ] {
                assert!(
                    !line.contains(keyword),
                    "{}: SQL in the runtime: {line}",
                    path.display()
                );
            }
        }
    }
}

/// The rule numbers docs/requirements.md defines: each rule is a `### R3: ...` heading.
fn defined_rules() -> Vec<String> {
    let text = std::fs::read_to_string(workspace().join("docs/requirements.md")).unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("### "))
        .filter_map(|title| title.split([':', ' ']).next())
        .filter(|word| crate::user_text::is_rule_number(word))
        .map(str::to_owned)
        .collect()
}

/// Every file under `dir` whose name ends with one of `endings`, with its text.
fn files(dir: &Path, endings: &[&str], out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            files(&path, endings, out);
        } else if endings.iter().any(|e| name.ends_with(e)) {
            out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The rule numbers `text` cites, each with its line. A word of that shape right after
/// `::` is a Rust path (`IpAddr::V4`), not a citation.
fn cited_rules(text: &str) -> Vec<(usize, &str)> {
    let mut cited = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut start = None;
        // A space after the line closes its last word.
        for (at, c) in line.char_indices().chain([(line.len(), ' ')]) {
            match (c.is_ascii_alphanumeric(), start) {
                (true, None) => start = Some(at),
                (false, Some(from)) => {
                    let word = &line[from..at];
                    if crate::user_text::is_rule_number(word) && !line[..from].ends_with("::") {
                        cited.push((number + 1, word));
                    }
                    start = None;
                }
                _ => {}
            }
        }
    }
    cited
}

#[test]
fn every_rule_number_the_code_cites_is_defined_in_the_requirements() {
    let defined = defined_rules();
    assert!(
        defined.len() > 40,
        "only {} rules found in docs/requirements.md: is each still a `### R3: ...` heading?",
        defined.len()
    );
    let mut sources = Vec::new();
    files(
        &workspace().join("crates"),
        &[".rs", ".sql", "Cargo.toml"],
        &mut sources,
    );
    // The engineers' documents cite the same numbers.
    files(&workspace().join("docs/design"), &[".md"], &mut sources);
    for name in ["Cargo.toml", "ARCHITECTURE.md", "BENCHMARKS.md"] {
        let path = workspace().join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        sources.push((path, text));
    }
    let mut undefined = Vec::new();
    let mut citations = 0;
    for (path, text) in &sources {
        for (line, rule) in cited_rules(text) {
            citations += 1;
            if !defined.iter().any(|d| d == rule) {
                let path = path.strip_prefix(workspace()).unwrap_or(path);
                undefined.push(format!("{}:{line}: {rule}", path.display()));
            }
        }
    }
    assert!(
        citations > 500,
        "only {citations} citations: the scan missed the sources"
    );
    assert!(
        undefined.is_empty(),
        "cited but not defined in docs/requirements.md (define the rule there, or say it in words):\n{}",
        undefined.join("\n")
    );
}

#[test]
fn a_rule_number_is_a_citation_only_outside_rust_paths() {
    assert_eq!(
        cited_rules("Some(IpAddr::V4(ip)) // V4: refused → see R3-R7 and M10 (amended)"),
        [(1, "V4"), (1, "R3"), (1, "R7"), (1, "M10")]
    );
}

#[test]
fn architecture_md_stays_short_and_every_path_it_names_exists() {
    let text = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines < 300,
        "ARCHITECTURE.md has {lines} lines: move the detail into docs/design/"
    );
    let roots = ["crates/", "docs/", "scripts/", "deploy/", "tests/", ".ci/"];
    let mut named = Vec::new();
    for (i, piece) in text.split('`').enumerate() {
        // Odd pieces are inside backticks; a link's target sits in `](...)`.
        if i % 2 == 1 && roots.iter().any(|r| piece.starts_with(r)) && !piece.contains(' ') {
            named.push(piece.to_owned());
        }
        for target in piece.split("](").skip(1) {
            let target = target.split([')', '#']).next().unwrap();
            if !target.is_empty() && !target.contains("://") {
                named.push(target.to_owned());
            }
        }
    }
    assert!(named.len() > 30, "only {} paths found", named.len());
    let missing: Vec<&String> = named
        .iter()
        .filter(|p| !workspace().join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// The type of the one `#[global_allocator]` static in `text`, if it declares one.
fn global_allocator(text: &str) -> Option<String> {
    let (_, after) = text.split_once("#[global_allocator]")?;
    let declaration = after.split_once(';')?.0;
    let (_, ty) = declaration.split_once(':')?;
    Some(ty.split('=').next()?.trim().to_owned())
}

#[test]
fn every_bench_runs_with_the_binarys_allocator() {
    let read = |path: &str| std::fs::read_to_string(workspace().join(path)).unwrap();
    let binary = global_allocator(&read("crates/runwarden/src/main.rs"));
    assert!(binary.is_some(), "the runwarden binary names no allocator");
    assert_eq!(
        global_allocator(&read("crates/benches/src/lib.rs")),
        binary,
        "the benches' library must set the binary's allocator, so an in-process bench \
         measures the product as shipped"
    );
    let mut unlinked = Vec::new();
    for entry in std::fs::read_dir(workspace().join("crates/benches/benches")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs")
            && !std::fs::read_to_string(&path)
                .unwrap()
                .contains("runwarden_benches")
        {
            unlinked.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(
        unlinked.is_empty(),
        "these benches do not link runwarden_benches, so they run on another allocator \
         (add `use runwarden_benches as _;`): {unlinked:?}"
    );
}

#[test]
fn the_allocator_is_read_from_its_declaration() {
    let text = "use x;\n/// doc\n#[global_allocator]\nstatic ALLOCATOR: a::B = a::B;\nfn f() {}";
    assert_eq!(global_allocator(text).as_deref(), Some("a::B"));
    assert_eq!(global_allocator("fn main() {}"), None);
}
