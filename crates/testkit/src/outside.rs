//! What a test that needs an outside part (a Python venv, the model server, a browser, the
//! MCP conformance suite) is given: the path an environment variable names, which
//! `.ci/run` sets from the script in `scripts/` that installs the part. Such tests sit in
//! their own test targets, out of plain `cargo test`; run without the variable, each fails
//! at once with one line naming what is missing and the command that provides it. A test
//! never installs anything itself.

use std::path::{Path, PathBuf};

/// The path `variable` names. Panics with one line when it is unset, empty or names
/// nothing: what is missing (`what`) and the command that provides it (`script`, which
/// prints the path as its last line).
pub fn required_path(variable: &str, what: &str, script: &str) -> PathBuf {
    let provide = format!(
        "run `export {variable}=\"$(bash {script} | tail -n 1)\"` (or `bash .ci/run`, which sets it)"
    );
    match std::env::var_os(variable).filter(|value| !value.is_empty()) {
        Some(path) if Path::new(&path).exists() => PathBuf::from(path),
        Some(path) => panic!(
            "{what} is missing: {variable} names {}, which does not exist; {provide}",
            Path::new(&path).display()
        ),
        None => panic!("{what} is missing: {variable} is not set; {provide}"),
    }
}
