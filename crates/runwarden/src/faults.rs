//! Which failures heal by themselves: the line between requeueing a run and
//! dead-lettering it, and between a 503 and a 500.

use runwarden_base::StoreError;

/// True when `error` says nothing about the request or the configuration, only about the
/// environment right now: a retryable store fault (locked, full, read-only, out of file
/// descriptors, I/O), an I/O error of running out of descriptors or space anywhere in the
/// chain, or any failure while this process cannot open one more file (some libraries
/// flatten the `EMFILE` behind their error into text).
pub(crate) fn is_transient(error: &anyhow::Error) -> bool {
    let in_chain = error.chain().any(|cause| {
        if let Some(store) = cause.downcast_ref::<StoreError>() {
            return store.is_retryable();
        }
        if let Some(runwarden_vault::VaultError::Store(store)) =
            cause.downcast_ref::<runwarden_vault::VaultError>()
        {
            return store.is_retryable();
        }
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(is_resource_exhaustion)
    });
    in_chain || out_of_descriptors()
}

/// `EMFILE`, `ENFILE` or `ENOSPC`.
pub(crate) fn is_resource_exhaustion(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::StorageFull
        || matches!(error.raw_os_error(), Some(EMFILE | ENFILE))
}

/// True when this process cannot open one more file right now.
pub(crate) fn out_of_descriptors() -> bool {
    match std::fs::File::open("/dev/null") {
        Ok(_) => false,
        Err(error) => matches!(error.raw_os_error(), Some(EMFILE | ENFILE)),
    }
}

/// "Too many open files" per process and per system (Linux and the BSDs alike).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;
    use runwarden_base::StoreFault;

    #[test]
    fn a_locked_store_behind_context_is_transient_and_a_configuration_error_is_not() {
        let locked: anyhow::Result<()> =
            Err(StoreError::with_fault("listing the catalogue", StoreFault::Busy, "locked").into());
        let locked = locked.context("while building agent a").unwrap_err();
        assert!(is_transient(&locked));
        let corrupt: anyhow::Error =
            StoreError::with_fault("listing the catalogue", StoreFault::Corrupt, "bad").into();
        assert!(!is_transient(&corrupt));
        let unbound = anyhow::anyhow!("pattern srv__* matches no imported tool");
        assert!(!is_transient(&unbound));
    }

    #[test]
    fn running_out_of_descriptors_or_space_is_transient() {
        for errno in [EMFILE, ENFILE, 28] {
            let error = anyhow::Error::from(std::io::Error::from_raw_os_error(errno));
            assert!(is_transient(&error), "errno {errno}");
        }
        let missing = anyhow::Error::from(std::io::Error::from_raw_os_error(2));
        assert!(!is_transient(&missing));
    }
}
