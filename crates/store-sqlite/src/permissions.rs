//! The database's files are the operator's alone: created 0600, and an existing file that
//! others may read is tightened when the store opens it (the secrets are sealed, but the
//! audit log, the runs and the token hashes are not for other users).

use std::path::{Path, PathBuf};

/// The files SQLite keeps for a database in WAL mode: the database, its write-ahead log
/// and its shared-memory index.
pub(crate) fn database_files(path: &Path) -> [PathBuf; 3] {
    let with_suffix = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [path.to_path_buf(), with_suffix("-wal"), with_suffix("-shm")]
}

/// Creates an empty database file with mode 0600 unless one exists. SQLite gives the
/// `-wal` and `-shm` files it creates later the mode of the database file, so this one
/// decides all three whatever the process's umask.
#[cfg(unix)]
pub(crate) fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(not(unix))]
pub(crate) fn create_private(_: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Removes the group and other bits of each existing file, answering one line per file it
/// changed (for the operator's warning). A file it cannot change (another owner) is
/// reported too, and never fails the open: the data is still the operator's to protect.
#[cfg(unix)]
pub(crate) fn tighten(files: &[PathBuf]) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut notes = Vec::new();
    for file in files {
        let Ok(metadata) = std::fs::metadata(file) else {
            continue; // not there (no -wal yet): nothing to tighten
        };
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 == 0 {
            continue;
        }
        let private = mode & 0o700;
        match std::fs::set_permissions(file, std::fs::Permissions::from_mode(private)) {
            Ok(()) => notes.push(format!(
                "{} was mode {mode:04o}, readable by other users: tightened it to {private:04o}",
                file.display()
            )),
            Err(error) => notes.push(format!(
                "{} is mode {mode:04o}, readable by other users, and could not be tightened ({error}): chmod 600 it",
                file.display()
            )),
        }
    }
    notes
}

#[cfg(not(unix))]
pub(crate) fn tighten(_: &[PathBuf]) -> Vec<String> {
    Vec::new()
}
