//! docs/openapi.json passes the official OpenAPI 3.1 validator (`openapi-spec-validator`),
//! so a client generator that validates first accepts it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable naming the validator's Python (`scripts/openapi-venv.sh`'s
/// last line); `.ci/run` sets it.
const PYTHON_ENV: &str = "RUNWARDEN_OPENAPI_PYTHON";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `$RUNWARDEN_OPENAPI_PYTHON`, else the venv `scripts/openapi-venv.sh` builds (or reuses).
fn validator_python() -> PathBuf {
    if let Some(path) = std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let output = Command::new("bash")
        .arg(repo_root().join("scripts/openapi-venv.sh"))
        .output()
        .expect("run scripts/openapi-venv.sh");
    assert!(
        output.status.success(),
        "this test needs the OpenAPI validator: `bash scripts/openapi-venv.sh` (python3 with \
         pip reaching PyPI) failed:\n{}\nset {PYTHON_ENV} to the python it prints last",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().expect("the venv's python").trim())
}

#[test]
fn the_api_description_passes_the_openapi_validator() {
    let doc = repo_root().join("docs/openapi.json");
    let output = Command::new(validator_python())
        .args(["-m", "openapi_spec_validator", "--schema", "3.1"])
        .arg(&doc)
        .output()
        .expect("run openapi_spec_validator");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(": OK"),
        "docs/openapi.json is not valid OpenAPI 3.1:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_validator_refuses_a_description_on_a_media_type() {
    // What the validator caught once: proof that it checks, not only parses.
    let text = std::fs::read_to_string(repo_root().join("docs/openapi.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["paths"]["/v1/runs/{id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
        ["description"] = "not allowed here".into();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("openapi.json");
    std::fs::write(&bad, doc.to_string()).unwrap();
    let output = Command::new(validator_python())
        .args(["-m", "openapi_spec_validator", "--schema", "3.1"])
        .arg(&bad)
        .output()
        .expect("run openapi_spec_validator");
    assert!(
        !output.status.success(),
        "the validator accepted a broken description"
    );
}
