//! Budgets per run (R13): output tokens, wall seconds and tool calls, from the agent and
//! lowered by the run's request, and the stop flag that ends a call in flight when one
//! runs out, through the same signal as a cancel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The termination reason code of a run that ran out of a budget (R13).
pub(crate) const BUDGET_EXCEEDED: &str = "BUDGET_EXCEEDED";

/// The request field that holds a run's own budgets, next to its prompt, so a requeued or
/// resumed run keeps them.
pub(crate) const REQUEST_BUDGETS_FIELD: &str = "budgets";

/// What a run may spend (R13). `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// Output tokens summed over the run's model steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens_total: Option<u64>,
    /// Seconds from the run's creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_seconds: Option<u64>,
    /// Tool calls made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
}

/// A request asked for more than the agent allows (R13: a request may only lower).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name} = {asked} is above the agent's limit of {allowed}: a run may only lower its agent's budgets"
)]
pub struct BudgetAboveAgent {
    /// The budget's name (`max_tool_calls`, ...).
    pub name: &'static str,
    /// What the request asked.
    pub asked: u64,
    /// What the agent allows.
    pub allowed: u64,
}

impl Budgets {
    /// True when no budget is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The request's budgets checked against the agent's (`self`): each may only lower
    /// the agent's value; a budget the agent does not set may be set by the request.
    pub fn check_request(&self, request: &Budgets) -> Result<(), BudgetAboveAgent> {
        let pairs = [
            (
                "max_output_tokens_total",
                request.max_output_tokens_total,
                self.max_output_tokens_total,
            ),
            (
                "max_wall_seconds",
                request.max_wall_seconds,
                self.max_wall_seconds,
            ),
            (
                "max_tool_calls",
                request.max_tool_calls.map(u64::from),
                self.max_tool_calls.map(u64::from),
            ),
        ];
        for (name, asked, allowed) in pairs {
            if let (Some(asked), Some(allowed)) = (asked, allowed)
                && asked > allowed
            {
                return Err(BudgetAboveAgent {
                    name,
                    asked,
                    allowed,
                });
            }
        }
        Ok(())
    }

    /// The budgets in force: the lower of the agent's and the request's for each kind.
    pub fn lowered_by(&self, request: &Budgets) -> Budgets {
        fn min<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        Budgets {
            max_output_tokens_total: min(
                self.max_output_tokens_total,
                request.max_output_tokens_total,
            ),
            max_wall_seconds: min(self.max_wall_seconds, request.max_wall_seconds),
            max_tool_calls: min(self.max_tool_calls, request.max_tool_calls),
        }
    }

    /// The budgets a stored request carries (none when it carries none). A stored field
    /// this binary cannot read is ignored with a warning rather than guessed.
    pub fn from_request(request: Option<&Value>) -> Budgets {
        let Some(field) = request.and_then(|r| r.get(REQUEST_BUDGETS_FIELD)) else {
            return Budgets::default();
        };
        serde_json::from_value(field.clone()).unwrap_or_else(|error| {
            tracing::warn!(%error, "the run's stored budgets could not be read; the agent's apply");
            Budgets::default()
        })
    }
}

/// One run's budget stop: set once, with what ran out, by the wall-clock timer or the
/// executor's counters; the run's signals read it like a cancel.
#[derive(Debug, Default)]
pub(crate) struct BudgetStop {
    flag: Arc<AtomicBool>,
    what: Mutex<Option<String>>,
}

impl BudgetStop {
    /// The flag the run's signals carry.
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// True once a budget ran out.
    pub(crate) fn is_tripped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Marks the budget spent, keeping the first thing that ran out.
    pub(crate) fn trip(&self, what: String) {
        let mut slot = self.what.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(what);
        }
        self.flag.store(true, Ordering::SeqCst);
    }

    /// The termination reason when a budget ran out.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.flag.load(Ordering::SeqCst) {
            return None;
        }
        let what = self.what.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Some(format!(
            "{BUDGET_EXCEEDED}: {}",
            what.unwrap_or_else(|| "a budget ran out".into())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_may_lower_but_never_raise_the_agents_budgets() {
        let agent = Budgets {
            max_output_tokens_total: Some(1_000),
            max_wall_seconds: None,
            max_tool_calls: Some(5),
        };
        let lower = Budgets {
            max_tool_calls: Some(2),
            max_wall_seconds: Some(30),
            ..Budgets::default()
        };
        assert_eq!(agent.check_request(&lower), Ok(()));
        let in_force = agent.lowered_by(&lower);
        assert_eq!(in_force.max_tool_calls, Some(2));
        assert_eq!(in_force.max_wall_seconds, Some(30));
        assert_eq!(in_force.max_output_tokens_total, Some(1_000));
        let higher = Budgets {
            max_tool_calls: Some(6),
            ..Budgets::default()
        };
        let error = agent.check_request(&higher).unwrap_err();
        assert_eq!(error.name, "max_tool_calls");
        assert!(error.to_string().contains("may only lower"), "{error}");
    }

    #[test]
    fn budgets_travel_in_the_stored_request() {
        let budgets = Budgets {
            max_wall_seconds: Some(9),
            ..Budgets::default()
        };
        let request = json!({"prompt": "go", REQUEST_BUDGETS_FIELD: budgets});
        assert_eq!(Budgets::from_request(Some(&request)), budgets);
        assert_eq!(
            Budgets::from_request(Some(&json!({"prompt": "go"}))),
            Budgets::default()
        );
    }

    #[test]
    fn the_first_budget_to_run_out_names_the_reason() {
        let stop = BudgetStop::default();
        assert_eq!(stop.reason(), None);
        stop.trip("max_tool_calls = 1".into());
        stop.trip("max_wall_seconds = 2".into());
        assert!(stop.flag().load(Ordering::SeqCst));
        assert_eq!(
            stop.reason().as_deref(),
            Some("BUDGET_EXCEEDED: max_tool_calls = 1")
        );
    }
}
