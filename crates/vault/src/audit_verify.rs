//! The audit chain walked: every row's link to the one before, the intents left without
//! an outcome, and the tip anchor that makes a cut tail visible.

use std::collections::BTreeSet;

use crate::audit::{AuditChain, AuditRow, AuditTip, VerifyReport, action};
use crate::store::{AuditFilter, StoreError, VaultStore};

impl AuditChain {
    /// Walks the whole log, page by page, and reports the first break in the chain.
    pub async fn verify(&self, store: &dyn VaultStore) -> Result<VerifyReport, StoreError> {
        const PAGE: u32 = 1_000;
        let mut expected_id = 1i64;
        let mut prev_hash = [0u8; 32];
        // V7 (amended): intents not yet completed, by id.
        let mut open_intents = BTreeSet::new();
        loop {
            let filter = AuditFilter {
                after_id: Some(expected_id - 1),
                limit: PAGE,
                ..AuditFilter::default()
            };
            let rows = store.audit_list(filter).await?;
            let page_len = rows.len();
            for row in rows {
                if let Some(broken) = self.row_break(&row, expected_id, &prev_hash) {
                    return Ok(broken);
                }
                if action::is_intent(&row.event.action) {
                    open_intents.insert(row.id);
                }
                if let Some(intent) = row.event.intent_id {
                    open_intents.remove(&intent);
                }
                prev_hash = row.hash;
                expected_id += 1;
            }
            if page_len < PAGE as usize {
                break;
            }
        }
        let rows = expected_id - 1;
        let tip = store.audit_tip().await?;
        let mut report = self.tip_report(tip, rows, &prev_hash);
        report.incomplete_calls = open_intents.len() as u64;
        Ok(report)
    }

    /// The break `row` makes when the walk expected row `expected_id` after a row whose
    /// hash is `prev_hash`: a gap, a row out of place, or contents that were altered.
    fn row_break(
        &self,
        row: &AuditRow,
        expected_id: i64,
        prev_hash: &[u8; 32],
    ) -> Option<VerifyReport> {
        let problem = if row.id != expected_id {
            format!(
                "row {expected_id} is missing: the log jumps to row {}",
                row.id
            )
        } else if row.prev_hash != *prev_hash {
            format!(
                "row {} does not follow row {}: a row was removed or moved",
                row.id,
                row.id - 1
            )
        } else if self.link(row.id, &row.event, &row.prev_hash) != row.hash {
            format!(
                "row {} was altered: its hash does not match its contents",
                row.id
            )
        } else {
            return None;
        };
        Some(VerifyReport::broken(expected_id - 1, row.id, problem))
    }

    /// The verdict on a log of `rows` good rows ending with `last_hash`, given its tip
    /// anchor: intact only when the anchor is there, unaltered and names that very row.
    fn tip_report(&self, tip: Option<AuditTip>, rows: i64, last_hash: &[u8; 32]) -> VerifyReport {
        let Some(tip) = tip else {
            return if rows == 0 {
                VerifyReport::intact(0)
            } else {
                VerifyReport::broken(
                    rows,
                    rows,
                    "the tip anchor is missing: the log cannot be shown complete".into(),
                )
            };
        };
        if self.anchor(tip.last_id, &tip.last_hash) != tip.anchor {
            VerifyReport::broken(rows, tip.last_id, "the tip anchor was altered".into())
        } else if tip.last_id > rows {
            VerifyReport::broken(
                rows,
                rows + 1,
                format!(
                    "the log was truncated: it ends at row {rows} but the tip anchor names row {}",
                    tip.last_id
                ),
            )
        } else if tip.last_id < rows || tip.last_hash != *last_hash {
            VerifyReport::broken(
                rows,
                tip.last_id,
                format!(
                    "the tip anchor names row {} but the log ends at row {rows} with another hash",
                    tip.last_id
                ),
            )
        } else {
            VerifyReport::intact(rows)
        }
    }
}
