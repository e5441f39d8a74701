//! The invariants of ARCHITECTURE.md that are about the shape of the code: each reads the
//! workspace's manifests or sources, so it fails the day the shape changes.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
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

const LIBRARIES: [&str; 6] = [
    "vault",
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
    assert!(
        dependencies("vault")
            .iter()
            .all(|d| !d.starts_with("runwarden")),
        "the vault depends on no crate of ours"
    );
    for krate in ["mcp", "models"] {
        let ours: Vec<String> = dependencies(krate)
            .into_iter()
            .filter(|d| d.starts_with("runwarden"))
            .collect();
        assert_eq!(
            ours,
            ["runwarden-vault"],
            "{krate} may use the vault and nothing else of ours"
        );
    }
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
