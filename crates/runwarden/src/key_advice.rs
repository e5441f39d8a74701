//! What to say when the master key is missing or wrong: where the backup should have come
//! from, and the two ways on (restore it, or start over knowingly with `init --new-key`).

use runwarden_vault::VaultError;

use crate::config::{Config, MASTER_KEY_ENV};
use crate::output;

/// The command that starts over without the lost key.
pub(crate) const NEW_KEY_HINT: &str = "runwarden init --new-key";

/// Whether `config` points at an installation that `init` already made: its audit anchor
/// or its SQLite database exists.
pub(crate) fn installed(config: &Config) -> bool {
    config.audit_anchor_file.exists()
        || config
            .store
            .sqlite_path()
            .is_some_and(std::path::Path::exists)
}

/// `error` with the way forward added when it is about the master key; any other error
/// is returned as it is.
pub(crate) fn advise(config: &Config, error: anyhow::Error) -> anyhow::Error {
    let about_the_key = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<VaultError>(),
            Some(
                VaultError::MasterKeyMissing { .. }
                    | VaultError::MasterKeyInvalid { .. }
                    | VaultError::WrongMasterKey { .. }
            )
        )
    });
    if !about_the_key {
        return error;
    }
    if !installed(config) {
        return anyhow::anyhow!(
            "{}: run `runwarden init` to create one",
            output::one_line(&error)
        );
    }
    anyhow::anyhow!(
        "{}\nThis installation's key is missing or wrong. Two ways on:\n  \
         1. restore the key from the backup made after `runwarden init` (a copy of {}, \
         or the value your deployment sets in ${MASTER_KEY_ENV}), then run the command again;\n  \
         2. start over knowingly with `{NEW_KEY_HINT}`: the old secrets stay unreadable, the \
         audit log is kept as closed history beside the new one, and a new key, vault and \
         audit chain begin.",
        output::one_line(&error),
        config.master_key_file.display()
    )
}
