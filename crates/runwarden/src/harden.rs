//! Process hardening: files created private (umask 077), no core dumps, and as many file
//! descriptors as the hard limit allows. All through rustix's safe wrappers
//! (`unsafe_code` is forbidden in this workspace).

/// Every file this process creates from here on (the database and its -wal and -shm
/// files, the key, the audit anchor, the configuration) is private to its owner, whatever
/// the umask it was started with. Call it before anything creates a file.
pub(crate) fn private_files() {
    #[cfg(unix)]
    {
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    }
}

/// No core dump: a core of a process with a call in flight holds the secret being placed
/// and the raw master key. Sets RLIMIT_CORE to 0 (soft and hard, so no child can raise it)
/// and, on Linux, PR_SET_DUMPABLE to 0, which also keeps other processes of the same user
/// from attaching with ptrace or reading /proc/<pid>/mem. Answers what could not be done.
pub(crate) fn no_core_dumps() -> Result<(), String> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, Rlimit, setrlimit};
        let none = Rlimit {
            current: Some(0),
            maximum: Some(0),
        };
        setrlimit(Resource::Core, none)
            .map_err(|e| format!("could not set RLIMIT_CORE to 0: {e}"))?;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::process::{DumpableBehavior, set_dumpable_behavior};
        set_dumpable_behavior(DumpableBehavior::NotDumpable)
            .map_err(|e| format!("could not set PR_SET_DUMPABLE to 0: {e}"))?;
    }
    Ok(())
}

/// Raises the soft limit of open files to the hard limit (a server holds a descriptor per
/// connection) and answers the soft limit now in force, `None` when unlimited or unknown.
pub(crate) fn raise_open_files() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        if limit.current != limit.maximum {
            let raised = Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            };
            if let Err(error) = setrlimit(Resource::Nofile, raised) {
                tracing::warn!(%error, "could not raise the open-file limit to its hard limit");
            }
        }
        getrlimit(Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The data directory (0700) and the audit anchor file (0600), tightened when
/// other users may read them; one line per change for the operator's warning. The key
/// itself is never changed here: a key file that others could read is refused when it is
/// loaded, because it may already have leaked and the operator must decide.
pub(crate) fn tighten_installation(config: &crate::config::Config) -> Vec<String> {
    let mut notes = Vec::new();
    tighten(&config.data_dir, 0o700, &mut notes);
    tighten(&config.audit_anchor_file, 0o600, &mut notes);
    notes
}

#[cfg(unix)]
fn tighten(path: &std::path::Path, private: u32, notes: &mut Vec<String>) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(metadata) = std::fs::metadata(path) else {
        return; // not there: nothing to tighten
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return;
    }
    let wanted = mode & private;
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted)) {
        Ok(()) => notes.push(format!(
            "{} was mode {mode:04o}, open to other users: tightened it to {wanted:04o}",
            path.display()
        )),
        Err(error) => notes.push(format!(
            "{} is mode {mode:04o}, open to other users, and could not be tightened ({error}): chmod {private:o} it",
            path.display()
        )),
    }
}

#[cfg(not(unix))]
fn tighten(_: &std::path::Path, _: u32, _: &mut Vec<String>) {}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    #[test]
    fn raising_the_open_file_limit_reaches_the_hard_limit() {
        let soft = super::raise_open_files();
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        assert_eq!(soft, hard);
    }
}
