//! The crates' layers, read from the workspace's real dependency graph (`cargo metadata`).
//! Normal and build dependencies point down only. Dev-dependencies that point up are
//! listed below, each with its reason: a new one fails, and so does a listed one that is
//! gone, so the list never goes stale.

use std::process::Command;

use serde_json::Value;

/// The layers, lowest first, exactly as ARCHITECTURE.md's "Layers" section draws them
/// (the test below compares the two). A crate may depend on crates of lower layers only.
const LAYERS: [&[&str]; 11] = [
    // The store error, the clock, one-line text: what every crate shares.
    &["base"],
    &["vault"],
    // The OAuth client of MCP servers: above the vault's egress, below the MCP client.
    &["oauth"],
    &["mcp", "models"],
    // Cedar policy over every call: depends on none of ours; the runtime asks it.
    &["policy"],
    &["runtime"],
    // The conformance suite runs the runtime's store traits; the stores' tests run it.
    &["storetest"],
    &["store-sqlite", "store-postgres"],
    // The test servers, the PostgreSQL cluster, and a vault over the real SQLite store.
    &["testkit"],
    &["runwarden"],
    // The benchmarks, in one crate so what they measure against (the official MCP SDK's
    // client, a second reqwest, PostgreSQL) stays out of the product crates' dependencies.
    &["benches"],
];

/// Dev-dependencies that point up a layer: (crate, dependency, why). All but the last close
/// a loop in the graph cargo builds for the crate's tests (`testkit` itself depends on the
/// SQLite store), so the structure work aims to remove them; until then each is named here.
#[rustfmt::skip]
const UPWARD_DEV_DEPENDENCIES: [(&str, &str, &str); 9] = [
    ("vault", "store-sqlite", "the vault's tests run over the real SQLite store"),
    ("vault", "testkit", "test servers, and a vault over the SQLite store"),
    ("mcp", "store-sqlite", "the liveness test keeps the client's state in a SQLite file"),
    ("mcp", "testkit", "the Python peer and real HTTP servers for the client's tests"),
    ("models", "store-sqlite", "unused directly: SQLite comes through testkit's loopback_vault"),
    ("models", "testkit", "real HTTP servers and llama.cpp for the providers' tests"),
    ("runtime", "store-sqlite", "the runtime's tests run durable runs on SQLite"),
    ("runtime", "testkit", "test servers for the runs' tools and models"),
    ("store-postgres", "testkit", "its own PostgreSQL cluster (TempCluster), timing figures"),
];

fn layer(krate: &str) -> usize {
    LAYERS
        .iter()
        .position(|layer| layer.contains(&krate))
        .unwrap_or_else(|| panic!("{krate} is in no layer: add it to LAYERS and ARCHITECTURE.md"))
}

/// Every dependency of a workspace crate on another: (crate, dependency, kind), where kind
/// is `normal`, `dev` or `build`, with the `runwarden-` prefix dropped from the names.
fn our_dependencies() -> Vec<(String, String, String)> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(super::workspace())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let short = |name: &str| name.strip_prefix("runwarden-").unwrap_or(name).to_owned();
    let ours: Vec<&str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let mut edges = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        for dependency in package["dependencies"].as_array().unwrap() {
            let name = dependency["name"].as_str().unwrap();
            if ours.contains(&name) {
                let kind = dependency["kind"].as_str().unwrap_or("normal");
                let from = short(package["name"].as_str().unwrap());
                edges.push((from, short(name), kind.to_owned()));
            }
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

#[test]
fn architecture_crates_depend_down_the_layers_and_only_listed_dev_dependencies_point_up() {
    let edges = our_dependencies();
    assert!(edges.len() > 20, "only {} edges: {edges:?}", edges.len());
    let mut wrong = Vec::new();
    let mut upward = Vec::new();
    for (from, to, kind) in &edges {
        if layer(to) < layer(from) {
            continue;
        }
        if kind == "dev" {
            upward.push((from.as_str(), to.as_str()));
            if !UPWARD_DEV_DEPENDENCIES
                .iter()
                .any(|(f, t, _)| f == from && t == to)
            {
                wrong.push(format!(
                    "{from} has a dev-dependency on {to}, above it: test it with what lies \
                     below, or list the edge with its reason in UPWARD_DEV_DEPENDENCIES"
                ));
            }
        } else {
            wrong.push(format!(
                "{from} has a {kind} dependency on {to}, which is not below it"
            ));
        }
    }
    for (from, to, why) in UPWARD_DEV_DEPENDENCIES {
        if !upward.contains(&(from, to)) {
            wrong.push(format!(
                "{from} no longer has a dev-dependency on {to} ({why}): remove it from \
                 UPWARD_DEV_DEPENDENCIES and lower the figure in ARCHITECTURE.md"
            ));
        }
    }
    println!("{} dev-dependencies point up the layers:", upward.len());
    for (from, to) in &upward {
        println!("  {from} -> {to}");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The layers as ARCHITECTURE.md draws them: the first code block after `### Layers`,
/// top layer first, one line per layer, its crates before two spaces and separated by
/// commas.
fn documented_layers() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(super::workspace().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("### Layers")
        .nth(1)
        .expect("a `### Layers` section");
    let block = section.split("```").nth(1).expect("a code block in it");
    let mut layers: Vec<Vec<String>> = block
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let names = line.split("  ").next().unwrap();
            names.split(',').map(|n| n.trim().to_owned()).collect()
        })
        .collect();
    layers.reverse();
    layers
}

#[test]
fn architecture_md_draws_the_layers_the_test_checks() {
    let ours: Vec<Vec<String>> = LAYERS
        .iter()
        .map(|layer| layer.iter().map(|n| (*n).to_owned()).collect())
        .collect();
    assert_eq!(
        documented_layers(),
        ours,
        "ARCHITECTURE.md's layers (top first) differ from LAYERS in {}",
        file!()
    );
}
