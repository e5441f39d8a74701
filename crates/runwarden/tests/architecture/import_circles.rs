//! Import circles between each crate's top-level modules, measured: module A depends on
//! module B when code in A names `crate::B...`, `super::B...` reaching the crate root, or a
//! name the crate root imports from B (`crate::Observer` when `lib.rs` has
//! `pub use executor::Observer`). A circle is a strongly connected set of two or more
//! modules. There are none: a new one fails the test.
//!
//! A text scan, not a parser (see `rust_source.rs`). Its limits: names a glob import
//! (`use crate::x::*`) brings in are not followed, and paths made by macros are not seen
//! (both can only hide an edge); `super::` inside an inline non-test module is read as if
//! at the file's level (the one such module, `vault/src/audit.rs`'s `mod action`, has none).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::rust_source::{code_only, rust_files, without_tests};

/// A crate's modules and, for each, the other modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level module a file under `src/` belongs to: `x.rs`, `x/...` → `x`; `None` for
/// the crate root (`lib.rs`, `main.rs`).
fn top_module(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" => None,
        file => Some(file.trim_end_matches(".rs").to_owned()),
    }
}

/// How many `super::` a file's code needs to reach the crate root: 1 for `x.rs` and
/// `x/mod.rs`, 2 for `x/y.rs`.
fn depth(relative: &Path) -> usize {
    let components = relative.components().count();
    if relative.ends_with("mod.rs") {
        components - 1
    } else {
        components
    }
}

/// The leading word (a name) of `s`, after any spaces.
fn word(s: &str) -> &str {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first name of each path a use tree names: `a::b` → `[a]`, `{a::b, c, D}` → `[a, c, D]`.
fn first_names(tree: &str) -> Vec<&str> {
    let tree = tree.trim_start();
    let Some(group) = tree.strip_prefix('{') else {
        return vec![word(tree)];
    };
    // Split the group at its top-level commas; nested groups follow a first name.
    let (mut names, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.push(word(&group[start..at]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(word(&group[start..at]));
                start = at + 1;
            }
            _ => {}
        }
    }
    names.into_iter().filter(|n| !n.is_empty()).collect()
}

/// Every place in `code` where a path starts with `prefix` (not as part of a longer name
/// or of `$crate`), with the text after the prefix.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    code.match_indices(prefix)
        .filter(|(at, _)| {
            let before = code[..*at].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':')
        })
        .map(|(at, _)| &code[at + prefix.len()..])
        .collect()
}

/// The names the crate root imports (`use x::{A, B};`, `pub use x::C as D;`), each with
/// the module it comes from: `crate::A` names module `x`.
fn root_imports(root: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for tree in paths_after(root, "use ") {
        let tree = &tree[..tree.find(';').unwrap_or(tree.len())];
        let tree = tree
            .trim()
            .trim_start_matches("crate::")
            .trim_start_matches("self::");
        let module = first_names(tree)[0].to_owned();
        // The last word of each leaf (the name it is known by at the root).
        let leaves = tree
            .split([',', '{', '}'])
            .filter_map(|leaf| leaf.split("::").last()?.split_whitespace().last());
        for leaf in leaves.filter(|l| !matches!(*l, "self" | "*")) {
            names.insert(leaf.to_owned(), module.clone());
        }
    }
    names
}

/// The module graph of the crate whose sources are under `src`.
fn module_graph(src: &Path) -> Graph {
    let files: Vec<_> = rust_files(src)
        .into_iter()
        .map(|(path, text)| {
            let relative = path.strip_prefix(src).unwrap().to_path_buf();
            (relative, without_tests(&code_only(&text)))
        })
        .collect();
    let root = files
        .iter()
        .find(|(relative, _)| top_module(relative).is_none())
        .map(|(_, code)| code.as_str())
        .unwrap_or_default();
    let imports = root_imports(root);
    let mut graph = Graph::new();
    for (relative, _) in &files {
        if let Some(module) = top_module(relative) {
            graph.entry(module).or_default();
        }
    }
    for (relative, code) in &files {
        let Some(module) = top_module(relative) else {
            continue;
        };
        let mut named = Vec::new();
        for rest in paths_after(code, "crate::") {
            named.extend(first_names(rest));
        }
        // `super::` as many times as the file is deep reaches the root; fewer stay inside.
        let to_root = "super::".repeat(depth(relative));
        for rest in paths_after(code, &to_root) {
            named.extend(first_names(rest));
        }
        for name in named {
            let target = if graph.contains_key(name) {
                Some(name.to_owned())
            } else {
                imports.get(name).cloned()
            };
            if let Some(target) = target.filter(|t| *t != module && graph.contains_key(t)) {
                graph.get_mut(&module).unwrap().insert(target);
            }
        }
    }
    graph
}

/// The modules `from` reaches, itself included.
fn reach(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::from([from.to_owned()]);
    let mut pending = vec![from.to_owned()];
    while let Some(module) = pending.pop() {
        for next in &graph[&module] {
            if seen.insert(next.clone()) {
                pending.push(next.clone());
            }
        }
    }
    seen
}

/// The strongly connected sets of two or more modules: the graphs are small (at most a few
/// dozen modules), so mutual reachability is plain enough.
fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(graph, m))).collect();
    let mut circles: Vec<BTreeSet<String>> = Vec::new();
    for (module, reaches) in &reached {
        let circle: BTreeSet<String> = reaches
            .iter()
            .filter(|other| reached[other].contains(*module))
            .cloned()
            .collect();
        if circle.len() > 1 && !circles.contains(&circle) {
            circles.push(circle);
        }
    }
    circles
}

#[test]
fn architecture_no_module_imports_another_that_imports_it_back() {
    let mut found = Vec::new();
    for (krate, src) in super::crate_sources() {
        for circle in circles(&module_graph(&src)) {
            let names: Vec<String> = circle.into_iter().collect();
            found.push(format!("{krate}: {}", names.join(", ")));
        }
    }
    println!("{} import circles:\n  {}", found.len(), found.join("\n  "));
    assert!(
        found.is_empty(),
        "{} import circles: break each (a module that needs another's item can take it \
         from a third, lower module):\n  {}",
        found.len(),
        found.join("\n  ")
    );
}

#[test]
fn architecture_import_scan_finds_paths_through_uses_paths_and_root_imports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |name: &str, text: &str| {
        let path = src.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "mod a; mod b; mod c; mod d;\npub use c::{Cee, sub::Deep as Renamed};\n",
    );
    write(
        "a.rs",
        "use crate::{b::{X, Y}, Renamed};\n// crate::d::commented\n",
    );
    write("b/mod.rs", "fn f() { super::a::g(); }\nmod inner;\n");
    write("b/inner.rs", "use super::super::d::Z;\nuse super::X;\n");
    write(
        "c.rs",
        "fn f() -> crate::a::T { \"crate::d\" }\n#[cfg(test)]\nmod tests { use crate::d; }\n",
    );
    write("d.rs", "macro_rules! m { () => { $crate::a::T } }\n");
    let graph = module_graph(src);
    let edges = |m: &str| graph[m].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("a"), ["b", "c"]);
    assert_eq!(edges("b"), ["a", "d"]);
    assert_eq!(edges("c"), ["a"]);
    assert!(edges("d").is_empty());
    let expected: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    assert_eq!(circles(&graph), [expected]);
}
