//! O5: the systemd unit in `deploy/` is one systemd accepts and scores as hardened, and it
//! runs what this binary calls `serve`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn unit_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/runwarden.service");
    std::fs::read_to_string(path).expect("deploy/runwarden.service exists")
}

/// The unit with its `ExecStart` pointed at the binary under test (verify checks that the
/// executable exists), in a directory of its own.
fn unit_for_this_binary(dir: &Path) -> PathBuf {
    let text = unit_text().replace("/usr/local/bin/runwarden", env!("CARGO_BIN_EXE_runwarden"));
    let path = dir.join("runwarden.service");
    std::fs::write(&path, text).unwrap();
    path
}

fn systemd_analyze() -> Option<PathBuf> {
    ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

#[test]
fn the_unit_keeps_the_settings_a_vault_process_needs() {
    let text = unit_text();
    for line in [
        "ExecStart=/usr/local/bin/runwarden serve",
        "DynamicUser=yes",
        "StateDirectory=runwarden",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        // V1: a core file could hold decrypted secrets.
        "LimitCORE=0",
        "UMask=0077",
        "KillMode=mixed",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "deploy/runwarden.service lacks {line:?}"
        );
    }
}

#[test]
fn systemd_verifies_the_unit_and_scores_it_hardened() {
    let Some(analyze) = systemd_analyze() else {
        println!("systemd-analyze is not installed: the unit's syntax was not verified");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_this_binary(dir.path());
    let verify = Command::new(&analyze)
        .arg("verify")
        .arg(&unit)
        .output()
        .unwrap();
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = Command::new(&analyze)
        .args(["security", "--offline=yes"])
        .arg(&unit)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&security.stdout);
    let score: f64 = report
        .lines()
        .find_map(|l| l.split("runwarden.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {report}"));
    println!("systemd-analyze security exposure: {score}");
    // 0 is locked down, 10 is unprotected; a service that must reach the network
    // cannot score below about 1.
    assert!(score <= 2.0, "exposure {score}: {report}");
}
