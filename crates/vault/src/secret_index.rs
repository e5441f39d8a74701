//! The matcher over every stored secret, built once and rebuilt when the secrets change.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::matcher::SecretMatcher;

/// The vault's one [`SecretMatcher`] over every stored secret, and the secrets' version
/// it was built at.
///
/// Secrets change in other processes too (`runwarden secret put` beside a running
/// server), so every use asks the store for the secrets' version
/// ([`sealed_secrets_version`](crate::store::VaultStore::sealed_secrets_version): one
/// row, read without waiting for a writer) and rebuilds on any difference.
///
/// **Freshness.** A change to the secrets (put, replace, remove, master-key rotation) that
/// committed, in this process or any other on the store, before a call began to ask for
/// the matcher is searched for by that call. One version read serves every call that was
/// already asking when the read began, and only those: concurrent callers share reads
/// without any of them getting an answer older than its own question. A call that got its
/// matcher before the change committed goes on with it. A change made through this vault
/// also drops the matcher at once.
#[derive(Default)]
pub(crate) struct SecretIndex {
    built: Mutex<Option<(u64, Arc<SecretMatcher>)>>,
    /// One rebuild at a time: concurrent callers wait for it rather than open every
    /// secret again each.
    rebuilding: tokio::sync::Mutex<()>,
    /// Callers that have begun to ask for the version so far.
    asked: AtomicU64,
    /// The newest version read and how many askers it answers. Never held across an
    /// await: a caller that finds a read under way waits for `read_done` instead.
    looked: Mutex<Look>,
    /// Wakes every waiting caller when a read ends, answered or failed.
    read_done: tokio::sync::Notify,
}

#[derive(Default)]
struct Look {
    /// Every caller whose ask number is at most this had begun asking before the read of
    /// `version` began.
    answers: u64,
    version: Option<u64>,
    /// A read is under way; callers that asked before it began will be answered by it.
    reading: bool,
}

/// Marks the one read under way; when it ends (or its caller is dropped mid-read), the
/// mark is cleared and every waiting caller wakes to take the answer or read again.
struct ReadUnderWay<'a>(&'a SecretIndex);

impl Drop for ReadUnderWay<'_> {
    fn drop(&mut self) {
        self.0.look().reading = false;
        self.0.read_done.notify_waiters();
    }
}

impl std::fmt::Debug for SecretIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretIndex")
    }
}

impl SecretIndex {
    /// The secrets' version as of a read that began after this call did (`read` runs it),
    /// shared with every other caller that was waiting when that read began. A failed
    /// read fails its own caller only; the callers waiting on it read again.
    pub(crate) async fn version<E, F, Fut>(&self, read: F) -> Result<u64, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<u64, E>>,
    {
        let ask = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let answers = loop {
            // Registered before the look, so a read that ends after it wakes this caller.
            let done = self.read_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            {
                let mut look = self.look();
                if let Some(version) = look.version.filter(|_| look.answers >= ask) {
                    return Ok(version);
                }
                if !look.reading {
                    look.reading = true;
                    // Loaded before the read begins: every ask counted here came first.
                    break self.asked.load(Ordering::SeqCst);
                }
            }
            done.await;
        };
        let under_way = ReadUnderWay(self);
        let version = read().await?;
        {
            let mut look = self.look();
            look.answers = answers;
            look.version = Some(version);
        }
        drop(under_way);
        Ok(version)
    }

    fn look(&self) -> std::sync::MutexGuard<'_, Look> {
        // Nothing panics while holding it; a poisoned lock still holds consistent numbers.
        self.looked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The matcher, when it was built at this version.
    pub(crate) fn current(&self, version: u64) -> Option<Arc<SecretMatcher>> {
        let built = self.built.lock().ok()?;
        match &*built {
            Some((at, matcher)) if *at == version => Some(matcher.clone()),
            _ => None,
        }
    }

    /// Keeps `matcher` as the one for `version`. It must have been built from secrets
    /// read after `version` was.
    pub(crate) fn store(&self, version: u64, matcher: Arc<SecretMatcher>) {
        if let Ok(mut built) = self.built.lock() {
            *built = Some((version, matcher));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Callers that wait while a read is under way share the next read; none is answered
    /// by a read that began before it asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_answers_only_the_callers_that_asked_before_it_began() {
        let index = Arc::new(SecretIndex::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        // The first caller's read is held open until the others have asked.
        let first = {
            let (index, reads, mut gate) = (index.clone(), reads.clone(), gate.clone());
            tokio::spawn(async move {
                index
                    .version(|| async move {
                        let n = reads.fetch_add(1, Ordering::SeqCst) as u64;
                        gate.wait_for(|open| *open).await.unwrap();
                        Ok::<u64, ()>(n)
                    })
                    .await
            })
        };
        while reads.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (0..8)
            .map(|_| {
                let (index, reads) = (index.clone(), reads.clone());
                tokio::spawn(async move {
                    index
                        .version(|| async move {
                            Ok::<u64, ()>(reads.fetch_add(1, Ordering::SeqCst) as u64)
                        })
                        .await
                })
            })
            .collect();
        while index.asked.load(Ordering::SeqCst) < 9 {
            tokio::task::yield_now().await;
        }
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap(), Ok(0));
        for caller in later {
            // Asked while read 0 was under way: answered by read 1, never by read 0.
            assert_eq!(caller.await.unwrap(), Ok(1));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2, "one read shared by eight");
        // A caller asking after every read began gets a read of its own.
        let own = index.version(|| async { Ok::<u64, ()>(7) }).await;
        assert_eq!(own, Ok(7));
    }
}
