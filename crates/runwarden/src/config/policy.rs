//! `[policy]`: the policy files' patterns resolved against the configuration file, and
//! the policies they hold, checked when the configuration loads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use runwarden_policy::{Policies, PolicyError, PolicyFile};

use super::file::PolicySection;

/// The policies in force and the files they came from.
#[derive(Debug, Clone)]
pub(crate) struct PolicyConfig {
    /// The files, as the operator finds them (relative to the configuration file).
    pub(crate) files: Vec<String>,
    /// The validated policies.
    pub(crate) policies: Arc<Policies>,
}

/// The section's files, read and validated; the error names each problem's file and line.
pub(super) fn policy(section: &PolicySection, base: &Path) -> anyhow::Result<PolicyConfig> {
    let files = read_files(&section.files, base)?;
    let policies = Policies::from_files(&files).map_err(|e| anyhow::anyhow!(problems_text(&e)))?;
    Ok(PolicyConfig {
        files: files.into_iter().map(|f| f.name).collect(),
        policies: Arc::new(policies),
    })
}

/// Every problem on its own line, for a refusal to start.
fn problems_text(error: &PolicyError) -> String {
    let problems = error.problems();
    if problems.len() == 1 {
        format!("[policy] files: {}", problems[0])
    } else {
        format!("[policy] files:\n  {}", problems.join("\n  "))
    }
}

/// The `[policy]` section of the file at `path` alone, without checking the rest:
/// `runwarden policy validate` reads it even when the policies would refuse the start.
/// `None` when there is no such section.
pub(crate) fn policy_files(path: &Path) -> anyhow::Result<Option<Vec<PolicyFile>>> {
    #[derive(serde::Deserialize)]
    struct OnlyPolicy {
        policy: Option<PolicySection>,
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("while reading the configuration {}", path.display()))?;
    let only: OnlyPolicy = toml::from_str(&text)
        .with_context(|| format!("while reading the configuration {}", path.display()))?;
    let Some(section) = only.policy else {
        return Ok(None);
    };
    let base = std::path::absolute(path)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    read_files(&section.files, &base).map(Some)
}

/// Reads the files the patterns name, in pattern order, each pattern's matches sorted;
/// a file named twice is read once.
pub(crate) fn read_files(patterns: &[String], base: &Path) -> anyhow::Result<Vec<PolicyFile>> {
    let mut files: Vec<PolicyFile> = Vec::new();
    for pattern in patterns {
        for (name, path) in expand(pattern, base)? {
            if files.iter().any(|f| f.name == name) {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("[policy] files: cannot read {name}"))?;
            files.push(PolicyFile { name, text });
        }
    }
    Ok(files)
}

/// The files one pattern names: `(name as written, path)`. A wildcard may stand only in
/// the last part of the path.
fn expand(pattern: &str, base: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let (dir, leaf) = match pattern.rsplit_once('/') {
        Some((dir, leaf)) => (dir, leaf),
        None => ("", pattern),
    };
    if dir.contains(['*', '?']) {
        bail!(
            "[policy] files: {pattern:?}: a wildcard may stand only in the file name, as in \"policies/*.cedar\""
        );
    }
    let join = |name: &str| {
        if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        }
    };
    let directory = if Path::new(dir).is_absolute() {
        PathBuf::from(dir)
    } else {
        base.join(dir)
    };
    if !leaf.contains(['*', '?']) {
        return Ok(vec![(pattern.to_string(), directory.join(leaf))]);
    }
    let entries = std::fs::read_dir(&directory)
        .with_context(|| format!("[policy] files: cannot list the folder of {pattern:?}"))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry
            .with_context(|| format!("[policy] files: cannot list the folder of {pattern:?}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_file() && wildcard(leaf, &name) {
            found.push((join(&name), entry.path()));
        }
    }
    if found.is_empty() {
        bail!("[policy] files: no file matches {pattern:?}");
    }
    found.sort();
    Ok(found)
}

/// True when `name` matches `pattern`, where `*` is any run of characters and `?` one.
fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with one backtrack point for the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_within_a_name() {
        assert!(wildcard("*.cedar", "tools.cedar"));
        assert!(wildcard("t?ols*", "tools.cedar"));
        assert!(!wildcard("*.cedar", "tools.cedar.bak"));
        assert!(wildcard("*", ""));
    }

    #[test]
    fn a_pattern_names_its_files_relative_to_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("policies")).unwrap();
        for name in ["b.cedar", "a.cedar", "notes.txt"] {
            std::fs::write(dir.path().join("policies").join(name), "").unwrap();
        }
        let files = read_files(&["policies/*.cedar".into()], dir.path()).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["policies/a.cedar", "policies/b.cedar"]);
        let none = read_files(&["policies/*.rego".into()], dir.path()).unwrap_err();
        assert!(none.to_string().contains("no file matches"), "{none}");
        let deep = read_files(&["*/x.cedar".into()], dir.path()).unwrap_err();
        assert!(deep.to_string().contains("only in the file name"), "{deep}");
    }
}
