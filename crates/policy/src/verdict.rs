//! What a decision answers: allow, deny or ask an operator, and which policies said so.

/// The reason given for a default deny: no permit policy matched.
pub const NO_PERMIT: &str = "no policy permits this";

/// The outcome of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A permit policy matched and no forbid policy did.
    Allow,
    /// A forbid policy matched or failed, or no permit policy matched.
    Deny,
    /// Allowed once an operator approves: a permit that matched requires approval.
    ApprovalRequired,
}

impl Decision {
    /// The stable word for machines: `allow`, `deny` or `approval_required`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::ApprovalRequired => "approval_required",
        }
    }

    /// Parses [`Decision::as_str`]'s words.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Allow, Self::Deny, Self::ApprovalRequired]
            .into_iter()
            .find(|d| d.as_str() == text)
    }
}

/// A decision with the policies that determined it and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The outcome.
    pub decision: Decision,
    /// The ids of the policies that determined it, sorted; empty for a default deny.
    pub policies: Vec<String>,
    /// Why, for people: each determining policy's `@reason`, a failed policy's error, or
    /// "no policy permits this".
    pub reasons: Vec<String>,
}

impl Verdict {
    /// One line for a model or an operator: `denied by policy P: reason`.
    pub fn summary(&self) -> String {
        let what = match self.decision {
            Decision::Allow => "allowed",
            Decision::Deny => "denied",
            Decision::ApprovalRequired => "approval required",
        };
        let by = match self.policies.as_slice() {
            [] => String::new(),
            [one] => format!(" by policy {one}"),
            many => format!(" by policies {}", many.join(", ")),
        };
        let why = if self.reasons.is_empty() {
            String::new()
        } else {
            format!(": {}", self.reasons.join("; "))
        };
        format!("{what}{by}{why}")
    }
}

impl Verdict {
    /// Two decisions a call needs both of (the call, and the secret its server uses):
    /// deny wins, and its policies are the ones named; else approval if either needs it;
    /// else allow. The policies and reasons of both are kept, without repeats.
    pub fn and(self, other: Verdict) -> Verdict {
        let (first, second) = match (self.decision, other.decision) {
            (Decision::Deny, Decision::Deny) => (self, other),
            (Decision::Deny, _) => return self,
            (_, Decision::Deny) => return other,
            _ => (self, other),
        };
        let decision = if first.decision == Decision::Allow {
            second.decision
        } else {
            first.decision
        };
        let mut policies = first.policies;
        policies.extend(second.policies);
        policies.sort();
        policies.dedup();
        let mut reasons = first.reasons;
        for reason in second.reasons {
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
        Verdict {
            decision,
            policies,
            reasons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_names_the_policy_and_the_reason() {
        let verdict = Verdict {
            decision: Decision::Deny,
            policies: vec!["no-etc".into()],
            reasons: vec!["writes stay under /srv".into()],
        };
        assert_eq!(
            verdict.summary(),
            "denied by policy no-etc: writes stay under /srv"
        );
    }

    #[test]
    fn decision_words_round_trip() {
        for d in [Decision::Allow, Decision::Deny, Decision::ApprovalRequired] {
            assert_eq!(Decision::parse(d.as_str()), Some(d));
        }
        assert_eq!(Decision::parse("maybe"), None);
    }

    fn verdict(decision: Decision, id: &str) -> Verdict {
        Verdict {
            decision,
            policies: vec![id.into()],
            reasons: vec![format!("because {id}")],
        }
    }

    #[test]
    fn of_two_decisions_deny_wins_then_approval() {
        use Decision::*;
        let both = verdict(Allow, "a").and(verdict(Deny, "d"));
        assert_eq!(both, verdict(Deny, "d"));
        let both = verdict(Deny, "d").and(verdict(ApprovalRequired, "q"));
        assert_eq!(both, verdict(Deny, "d"));
        let both = verdict(Allow, "a").and(verdict(ApprovalRequired, "q"));
        assert_eq!(both.decision, ApprovalRequired);
        assert_eq!(both.policies, vec!["a", "q"]);
        let both = verdict(Allow, "a").and(verdict(Allow, "a"));
        assert_eq!(both, verdict(Allow, "a"));
        let both = verdict(Deny, "x").and(verdict(Deny, "d"));
        assert_eq!(both.policies, vec!["d", "x"]);
    }
}
