//! `runwarden doctor` and `runwarden backup` over real files: a healthy installation
//! passes every check; a backup is a copy that opens with the same key and verifies
//! against the anchor copied beside it (the restore the README describes); each problem
//! (a file others can read, a missing anchor, a damaged page) is named with what to do,
//! and exits 1.

use std::os::unix::fs::PermissionsExt as _;

use serde_json::Value;

use crate::support::{SIGIL, Sandbox};

/// The verdict of the check `name` in `doctor --json`'s answer.
#[track_caller]
fn verdict<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {report:#}"))
}

#[test]
fn a_healthy_installation_passes_and_its_backup_restores_with_the_key_and_the_anchor() {
    let sandbox = Sandbox::initialised();
    sandbox.put("api_token", SIGIL);
    let report = sandbox.run(&["--json", "doctor"]).ok().json();
    assert_eq!(report["problems"], 0, "{report:#}");
    for name in [
        "database integrity",
        "write-ahead log",
        "free space",
        "file modes",
        "store",
        "master key",
        "audit anchor",
    ] {
        assert_eq!(verdict(&report, name)["verdict"], "ok", "{report:#}");
    }
    // No worker ever ran: a note with what to do, not a problem.
    assert_eq!(verdict(&report, "workers")["verdict"], "note", "{report:#}");
    let text = sandbox.run(&["doctor"]).ok();
    assert!(text.stdout.contains("no problem found"), "{text:#?}");

    let dest = sandbox.path().join("copy.db");
    let out = sandbox
        .run(&["backup", dest.to_str().unwrap()])
        .ok()
        .says("integrity ok")
        .says("keep beside it")
        .says(&sandbox.key_file().display().to_string());
    assert!(!out.all().contains(SIGIL), "{out:#?}");
    let anchor = sandbox.path().join("copy.db.anchor");
    for file in [&dest, &anchor] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is private", file.display());
    }
    sandbox
        .run(&["backup", dest.to_str().unwrap()])
        .fails()
        .says("exists: name a new file");

    // Restore (see the README): the copy and its anchor in place of the originals.
    let database = sandbox.database();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", database.display()));
    }
    std::fs::copy(&dest, &database).unwrap();
    std::fs::copy(&anchor, sandbox.data_dir().join("audit.anchor")).unwrap();
    sandbox.run(&["secret", "list"]).ok().says("api_token");
    sandbox.run(&["audit", "verify"]).ok();
    assert_eq!(
        sandbox.run(&["--json", "doctor"]).ok().json()["problems"],
        0
    );
}

#[test]
fn each_problem_is_named_with_what_to_do_and_exits_1() {
    let sandbox = Sandbox::initialised();
    sandbox.put("api_token", SIGIL);

    std::fs::set_permissions(sandbox.key_file(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = sandbox.run(&["--json", "doctor"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    let modes = verdict(&out.json(), "file modes").clone();
    assert_eq!(modes["verdict"], "problem", "{modes:#}");
    assert!(
        modes["action"].as_str().unwrap().contains("chmod 600"),
        "{modes:#}"
    );
    std::fs::set_permissions(sandbox.key_file(), std::fs::Permissions::from_mode(0o600)).unwrap();

    let anchor = sandbox.data_dir().join("audit.anchor");
    std::fs::rename(&anchor, sandbox.path().join("aside.anchor")).unwrap();
    let out = sandbox.run(&["doctor"]).fails();
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(out.stdout.contains("PROBLEM audit anchor"), "{out:#?}");
    assert!(out.stdout.contains("--adopt-anchor"), "{out:#?}");
    std::fs::rename(sandbox.path().join("aside.anchor"), &anchor).unwrap();

    // A damaged page: the second half of the file overwritten.
    let database = sandbox.database();
    let mut bytes = std::fs::read(&database).unwrap();
    let half = bytes.len() / 2;
    bytes[half..].fill(0xA5);
    std::fs::write(&database, bytes).unwrap();
    let out = sandbox.run(&["--json", "doctor"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    let report = out.json();
    let integrity = verdict(&report, "database integrity");
    assert_eq!(integrity["verdict"], "problem", "{report:#}");
    assert!(
        integrity["action"]
            .as_str()
            .unwrap()
            .contains("restore the last backup"),
        "{report:#}"
    );
    assert!(!out.all().contains(SIGIL));
}
