//! The matcher over every stored secret, built once and rebuilt when the secrets change.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use crate::matcher::SecretMatcher;
use crate::store::SealedMeta;

/// The vault's one [`SecretMatcher`] over every stored secret, and what it was built from.
///
/// Secrets change in other processes too (`runwarden secret put` beside a running
/// server), so each use compares the list of secrets (names and times, never values,
/// one store query) with the list the matcher was built from, and rebuilds on any
/// difference. A put, remove or rotation in this process drops the matcher at once.
#[derive(Default)]
pub(crate) struct SecretIndex {
    built: Mutex<Option<(u64, Arc<SecretMatcher>)>>,
    /// One rebuild at a time: concurrent callers wait for it rather than open every
    /// secret again each.
    rebuilding: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for SecretIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretIndex")
    }
}

/// What a matcher is valid for: every secret's name, algorithm and times.
pub(crate) fn fingerprint(list: &[SealedMeta]) -> u64 {
    let mut hasher = DefaultHasher::new();
    list.len().hash(&mut hasher);
    for meta in list {
        meta.name.hash(&mut hasher);
        meta.algorithm.hash(&mut hasher);
        meta.created_ms.hash(&mut hasher);
        meta.updated_ms.hash(&mut hasher);
    }
    hasher.finish()
}

impl SecretIndex {
    /// The matcher, when it was built from the list with this fingerprint.
    pub(crate) fn current(&self, fingerprint: u64) -> Option<Arc<SecretMatcher>> {
        let built = self.built.lock().ok()?;
        match &*built {
            Some((at, matcher)) if *at == fingerprint => Some(matcher.clone()),
            _ => None,
        }
    }

    /// Keeps `matcher` as the one for `fingerprint`.
    pub(crate) fn store(&self, fingerprint: u64, matcher: Arc<SecretMatcher>) {
        if let Ok(mut built) = self.built.lock() {
            *built = Some((fingerprint, matcher));
        }
    }

    /// Forgets the matcher: the secrets changed.
    pub(crate) fn invalidate(&self) {
        if let Ok(mut built) = self.built.lock() {
            *built = None;
        }
    }

    /// Held while one caller rebuilds.
    pub(crate) async fn rebuild_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.rebuilding.lock().await
    }
}
