//! Which policies can apply to a call, by its action and resource. Cedar's authorizer
//! evaluates every policy it is given; a policy whose scope names another action or
//! another resource is never satisfied and never fails (its scope is false before any
//! condition runs), so leaving it out changes no decision, no determining policy and no
//! error. Decisions then cost what the policies about the call cost, not the whole set.

use std::collections::HashMap;

use cedar_policy::{ActionConstraint, EntityUid, PolicySet, ResourceConstraint};

/// The policy set sliced by action and resource.
pub(crate) struct Index {
    /// By action: the policies in scope for it that name no single resource.
    general: HashMap<EntityUid, PolicySet>,
    /// By action and resource: the general ones and those naming this resource.
    specific: HashMap<(EntityUid, EntityUid), PolicySet>,
    empty: PolicySet,
}

impl Index {
    /// Slices `set` for each of `actions` (the schema's).
    pub(crate) fn new(set: &PolicySet, actions: &[EntityUid]) -> Self {
        let mut general: HashMap<EntityUid, PolicySet> = HashMap::new();
        let mut named = Vec::new();
        for action in actions {
            let mut slice = PolicySet::new();
            for policy in set
                .policies()
                .filter(|p| applies_to(&p.action_constraint(), action))
            {
                match policy.resource_constraint() {
                    // `in` stays general: a resource may one day have parents.
                    ResourceConstraint::Eq(resource) => {
                        named.push((action.clone(), resource, policy.clone()));
                    }
                    _ => {
                        // Ids are unique in `set`, so adding cannot fail.
                        let _ = slice.add(policy.clone());
                    }
                }
            }
            general.insert(action.clone(), slice);
        }
        let mut specific: HashMap<(EntityUid, EntityUid), PolicySet> = HashMap::new();
        for (action, resource, policy) in named {
            let slice = specific
                .entry((action.clone(), resource))
                .or_insert_with(|| general.get(&action).cloned().unwrap_or_default());
            let _ = slice.add(policy);
        }
        Self {
            general,
            specific,
            empty: PolicySet::new(),
        }
    }

    /// The policies that can apply to `action` on `resource`.
    pub(crate) fn slice(&self, action: &EntityUid, resource: &EntityUid) -> &PolicySet {
        self.specific
            .get(&(action.clone(), resource.clone()))
            .or_else(|| self.general.get(action))
            .unwrap_or(&self.empty)
    }
}

/// Whether a policy's action scope admits `action`. The schema's actions have no groups,
/// so `in [a, b]` admits exactly a and b.
fn applies_to(constraint: &ActionConstraint, action: &EntityUid) -> bool {
    match constraint {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(one) => one == action,
        ActionConstraint::In(many) => many.contains(action),
    }
}
