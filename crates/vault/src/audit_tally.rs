//! The audit rows counted by action, kept between metrics scrapes so each scrape reads only
//! the rows appended since the last one.
//!
//! Audit rows are only ever appended, and their ids commit in order (the chain's tip is
//! extended under the write lock, or the chain's advisory lock on PostgreSQL), so every
//! read sees all rows up to some id and none after a gap. A count of the rows after the
//! last id counted, added to the tally, is the count of the whole log. Counting the whole
//! log at every scrape read every row: a tenth of a second of a core per million rows.

use std::collections::BTreeMap;

/// One count of audit rows, as a store reads it ([`VaultStore::audit_counts`]).
///
/// [`VaultStore::audit_counts`]: crate::store::VaultStore::audit_counts
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditCounted {
    /// The hash of the row with the id asked after, read first; `None` when no row has
    /// that id (or none was asked).
    pub at_after: Option<[u8; 32]>,
    /// The newest row when the count began, its id and hash; `None` for an empty log.
    /// The rows counted are those after the id asked, up to this one.
    pub newest: Option<(i64, [u8; 32])>,
    /// How many of the rows counted carry each action, ordered by action.
    pub by_action: Vec<(String, u64)>,
}

/// The audit rows counted so far, by action.
#[derive(Debug, Default)]
pub struct AuditTally {
    /// The last row counted, its id and hash. Rows are chained by hash, so while the log
    /// holds this row with this hash, it holds every row before it as counted.
    through: Option<(i64, [u8; 32])>,
    by_action: BTreeMap<String, u64>,
}

impl AuditTally {
    /// The id after which rows are still to be counted; `None`: every row.
    pub fn after(&self) -> Option<i64> {
        self.through.map(|(id, _)| id)
    }

    /// Adds a count of the rows after [`after`](Self::after). Answers false, and starts
    /// over empty, when the log no longer holds the last row counted as it was counted:
    /// the log was wiped or restored from another copy, so the caller counts it all again.
    pub fn add(&mut self, counted: AuditCounted) -> bool {
        if let Some((_, hash)) = self.through
            && counted.at_after != Some(hash)
        {
            *self = Self::default();
            return false;
        }
        for (action, n) in counted.by_action {
            *self.by_action.entry(action).or_default() += n;
        }
        if counted.newest.is_some() {
            self.through = counted.newest;
        }
        true
    }

    /// The rows counted, by action, ordered by action.
    pub fn counts(&self) -> Vec<(String, u64)> {
        self.by_action
            .iter()
            .map(|(action, n)| (action.clone(), *n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{AuditCounted, AuditTally};

    fn counted(
        at_after: Option<u8>,
        newest: Option<(i64, u8)>,
        by_action: &[(&str, u64)],
    ) -> AuditCounted {
        AuditCounted {
            at_after: at_after.map(|h| [h; 32]),
            newest: newest.map(|(id, h)| (id, [h; 32])),
            by_action: by_action.iter().map(|(a, n)| (a.to_string(), *n)).collect(),
        }
    }

    #[test]
    fn each_count_adds_the_rows_after_the_last_one_counted() {
        let mut tally = AuditTally::default();
        assert_eq!(tally.after(), None, "the first count reads every row");
        assert!(tally.add(counted(
            None,
            Some((3, 3)),
            &[("http_call", 2), ("proxy_connect", 1)]
        )));
        assert_eq!(tally.after(), Some(3));
        assert!(tally.add(counted(Some(3), Some((7, 7)), &[("http_call", 4)])));
        assert_eq!(
            tally.counts(),
            vec![
                ("http_call".to_string(), 6),
                ("proxy_connect".to_string(), 1)
            ]
        );
        assert_eq!(tally.after(), Some(7));
    }

    #[test]
    fn a_count_that_finds_nothing_new_keeps_the_tally() {
        let mut tally = AuditTally::default();
        assert!(tally.add(counted(None, None, &[])), "an empty log");
        assert_eq!(tally.after(), None);
        assert!(tally.add(counted(None, Some((2, 2)), &[("http_call", 2)])));
        assert!(tally.add(counted(Some(2), Some((2, 2)), &[])));
        assert_eq!(tally.after(), Some(2));
        assert_eq!(tally.counts(), vec![("http_call".to_string(), 2)]);
    }

    #[test]
    fn a_log_that_no_longer_holds_the_last_row_counted_is_counted_again() {
        let mut tally = AuditTally::default();
        assert!(tally.add(counted(None, Some((9, 9)), &[("http_call", 9)])));
        // Restored from a copy with five rows: no row 9.
        assert!(!tally.add(counted(None, Some((5, 5)), &[])));
        assert_eq!(tally.after(), None);
        assert_eq!(tally.counts(), vec![]);
        // Wiped, then written past where the tally stood: row 9 is another row now.
        assert!(tally.add(counted(None, Some((9, 9)), &[("http_call", 9)])));
        assert!(!tally.add(counted(Some(1), Some((12, 12)), &[("proxy_connect", 3)])));
        assert_eq!(tally.counts(), vec![]);
    }
}
