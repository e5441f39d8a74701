//! The audit rows this process committed itself, as one unbroken stretch of the chain.
//!
//! Before the anchor moves, the writer checks that the new rows extend the row the anchor
//! records (a rolled-back log never moves it). When that row and the new rows' predecessor
//! are both in one stretch this process committed, each row linked to the one before as
//! the store reported it, the rows extend the anchor: a row's hash covers the hash before
//! it, so the store could only have chained the new rows to that predecessor if the rows
//! between, the anchored one included, are the ones in the stretch. The log is then read
//! again only when another process wrote in between.

use std::collections::VecDeque;

use crate::audit::AuditRow;
use crate::witness::Anchored;

/// The most rows kept: a few batches, which is as far as the anchor trails the log.
const KEPT: usize = 2048;

/// One row's place in the chain.
#[derive(Debug, Clone, Copy)]
struct Link {
    id: i64,
    hash: [u8; 32],
}

/// Consecutive rows, each the one after the row before it in the chain.
#[derive(Debug, Default)]
pub(crate) struct OwnRows {
    stretch: VecDeque<Link>,
}

impl OwnRows {
    /// Adds rows this process just committed, oldest first. A row that does not follow the
    /// last one kept (another process wrote in between, or the log was replaced) starts a
    /// new stretch.
    pub(crate) fn remember(&mut self, rows: &[AuditRow]) {
        for row in rows {
            let follows = self
                .stretch
                .back()
                .is_some_and(|last| last.id + 1 == row.id && last.hash == row.prev_hash);
            if !follows {
                self.stretch.clear();
            }
            self.stretch.push_back(Link {
                id: row.id,
                hash: row.hash,
            });
        }
        while self.stretch.len() > KEPT {
            self.stretch.pop_front();
        }
    }

    /// True when the stretch holds the anchored row with its hash and, with the hash
    /// `first` names, the row before `first`: then `first` extends the anchor. False
    /// means "read the log", never "broken".
    pub(crate) fn link(&self, anchored: Anchored, first: &AuditRow) -> bool {
        let holds = |id: i64, hash: &[u8; 32]| self.at(id).is_some_and(|l| l.hash == *hash);
        holds(anchored.length, &anchored.hash) && holds(first.id - 1, &first.prev_hash)
    }

    /// Drops the rows before `id`: the anchor has moved past them.
    pub(crate) fn forget_before(&mut self, id: i64) {
        while self.stretch.front().is_some_and(|l| l.id < id) {
            self.stretch.pop_front();
        }
    }

    fn at(&self, id: i64) -> Option<&Link> {
        let front = self.stretch.front()?;
        let offset = usize::try_from(id.checked_sub(front.id)?).ok()?;
        self.stretch.get(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditChain;
    use crate::audit::tests::call;

    fn anchor(row: &AuditRow) -> Anchored {
        Anchored {
            length: row.id,
            hash: row.hash,
        }
    }

    fn after(chain: &AuditChain, last: &AuditRow, n: usize) -> Vec<AuditRow> {
        chain.extend(
            Some((last.id, last.hash)),
            (0..n).map(|_| call("/x")).collect(),
        )
    }

    #[test]
    fn rows_committed_one_after_another_link_the_anchor_to_the_next_batch() {
        let chain = AuditChain::from_audit_key(&[3; 32]);
        let mut own = OwnRows::default();
        let first = chain.extend(None, vec![call("/a"), call("/b")]);
        own.remember(&first);
        let outcome = after(&chain, &first[1], 1);
        own.remember(&outcome);
        let next = after(&chain, &outcome[0], 2);
        own.remember(&next);
        assert!(own.link(anchor(&first[1]), &next[0]));
        assert!(own.link(anchor(&first[0]), &next[0]));
    }

    #[test]
    fn a_row_written_by_another_process_in_between_means_reading_the_log() {
        let chain = AuditChain::from_audit_key(&[3; 32]);
        let mut own = OwnRows::default();
        let first = chain.extend(None, vec![call("/a")]);
        own.remember(&first);
        let theirs = after(&chain, &first[0], 1); // not remembered: another process's
        let next = after(&chain, &theirs[0], 1);
        own.remember(&next);
        assert!(!own.link(anchor(&first[0]), &next[0]));
    }

    #[test]
    fn an_anchor_that_names_another_hash_is_never_linked() {
        let chain = AuditChain::from_audit_key(&[3; 32]);
        let mut own = OwnRows::default();
        let first = chain.extend(None, vec![call("/a"), call("/b")]);
        own.remember(&first);
        let next = after(&chain, &first[1], 1);
        own.remember(&next);
        let replaced = Anchored {
            length: first[1].id,
            hash: [9; 32],
        };
        assert!(!own.link(replaced, &next[0]));
        // A log rolled back and written again: the new row 2 does not follow the old one.
        let rewritten = chain.extend(Some((1, first[0].hash)), vec![call("/other")]);
        own.remember(&rewritten);
        let after_rewrite = after(&chain, &rewritten[0], 1);
        own.remember(&after_rewrite);
        assert!(!own.link(anchor(&first[1]), &after_rewrite[0]));
        assert!(own.link(anchor(&rewritten[0]), &after_rewrite[0]));
    }

    #[test]
    fn rows_the_anchor_has_passed_are_forgotten() {
        let chain = AuditChain::from_audit_key(&[3; 32]);
        let mut own = OwnRows::default();
        let first = chain.extend(None, vec![call("/a"), call("/b"), call("/c")]);
        own.remember(&first);
        own.forget_before(3);
        let next = after(&chain, &first[2], 1);
        own.remember(&next);
        assert!(
            !own.link(anchor(&first[1]), &next[0]),
            "row 2 was forgotten"
        );
        assert!(own.link(anchor(&first[2]), &next[0]));
    }
}
