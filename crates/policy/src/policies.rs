//! `Policies`: a loaded, validated policy set, and the one decision every call asks of it.

use std::collections::{HashMap, HashSet};
use std::str::FromStr as _;

use cedar_policy::{
    Authorizer, Context, Effect, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    EvaluationError, Policy, PolicyId, PolicySet, RestrictedExpression,
};

use crate::error::PolicyError;
use crate::index::Index;
use crate::load::{APPROVAL, PolicyFile, REASON, load};
use crate::request::{Request, Target};
use crate::value::record;
use crate::verdict::{Decision, NO_PERMIT, Verdict};

/// A validated set of policies. Cheap to ask; build a new one to change it.
pub struct Policies {
    /// The set, sliced by action and resource: a decision asks only what can apply.
    index: Index,
    authorizer: Authorizer,
    names: Names,
    /// Each policy's effect, `@reason` and whether it requires approval, by id.
    facts: HashMap<PolicyId, Facts>,
    /// What any call could reach, whatever its arguments ([`Policies::could_allow`]).
    reach: Index,
}

struct Facts {
    effect: Effect,
    reason: Option<String>,
    approval: bool,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("count", &self.facts.len())
            .finish_non_exhaustive()
    }
}

impl Policies {
    /// Parses and validates the files' policies against the schema. Every problem is
    /// reported, each with its file and line.
    pub fn from_files(files: &[PolicyFile]) -> Result<Self, PolicyError> {
        let set = load(files)?;
        let facts = set
            .policies()
            .map(|p| {
                let facts = Facts {
                    effect: p.effect(),
                    reason: p.annotation(REASON).map(str::to_string),
                    approval: p.annotation(APPROVAL) == Some("required"),
                };
                (p.id().clone(), facts)
            })
            .collect();
        let names = Names::new()?;
        let actions: Vec<EntityUid> = ["call_tool", "call_model", "read_secret"]
            .iter()
            .filter_map(|a| names.uid("Action", a))
            .collect();
        Ok(Self {
            index: Index::new(&set, &actions),
            reach: Index::new(&reach_of(&set), &actions),
            authorizer: Authorizer::new(),
            names,
            facts,
        })
    }

    /// Reads the files and loads them; each is named as given.
    pub fn read(paths: &[std::path::PathBuf]) -> Result<Self, PolicyError> {
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
                file: name.clone(),
                source,
            })?;
            files.push(PolicyFile { name, text });
        }
        Self::from_files(&files)
    }

    /// How many policies there are.
    pub fn len(&self) -> usize {
        self.facts.len()
    }

    /// True when there are none (every call is then denied).
    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }

    /// Every policy's id, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.facts.keys().map(ToString::to_string).collect();
        ids.sort();
        ids
    }

    /// Decides one call. Deny wins: a forbid that matches, or that fails to evaluate,
    /// denies; with no permit that matches, the call is denied. A permit marked
    /// `@approval("required")` among those that allow it makes the call wait for an
    /// operator (any one such permit is enough: the safer reading).
    pub fn decide(&self, request: &Request) -> Verdict {
        let Some((cedar, entities, action, resource)) = cedar_request(&self.names, request) else {
            return Verdict {
                decision: Decision::Deny,
                policies: Vec::new(),
                reasons: vec!["the call's arguments could not be read as policy values".into()],
            };
        };
        let slice = self.index.slice(&action, &resource);
        let response = self.authorizer.is_authorized(&cedar, slice, &entities);
        let matched: Vec<&PolicyId> = response.diagnostics().reason().collect();
        let mut failed_forbids = Vec::new();
        let mut failed_permits = Vec::new();
        for error in response.diagnostics().errors() {
            let cedar_policy::AuthorizationError::PolicyEvaluationError(error) = error;
            let id = error.policy_id();
            let text = format!("policy {id} failed: {}", safe_text(error.inner()));
            match self.facts.get(id).map(|f| f.effect) {
                Some(Effect::Forbid) => failed_forbids.push((id, text)),
                _ => failed_permits.push(text),
            }
        }
        let forbids: Vec<&PolicyId> = matched
            .iter()
            .copied()
            .filter(|id| self.facts.get(*id).map(|f| f.effect) == Some(Effect::Forbid))
            .collect();
        if !forbids.is_empty() || !failed_forbids.is_empty() {
            let mut policies: Vec<String> = forbids.iter().map(ToString::to_string).collect();
            let mut reasons: Vec<String> = forbids.iter().map(|id| self.reason(id)).collect();
            for (id, text) in failed_forbids {
                policies.push(id.to_string());
                reasons.push(text);
            }
            return verdict(Decision::Deny, policies, reasons);
        }
        if matched.is_empty() {
            let mut reasons = vec![NO_PERMIT.to_string()];
            reasons.extend(failed_permits);
            return verdict(Decision::Deny, Vec::new(), reasons);
        }
        let approval = matched
            .iter()
            .any(|id| self.facts.get(*id).is_some_and(|f| f.approval));
        let policies = matched.iter().map(ToString::to_string).collect();
        let reasons = matched
            .iter()
            .filter_map(|id| self.facts.get(*id).and_then(|f| f.reason.clone()))
            .collect();
        let decision = if approval {
            Decision::ApprovalRequired
        } else {
            Decision::Allow
        };
        verdict(decision, policies, reasons)
    }

    /// True when some call to `request`'s target by its principal could be allowed,
    /// whatever its arguments and its run: some permit's scope reaches it and no forbid
    /// without conditions covers it. (The arguments and the run of `request` are not read.)
    /// A tool for which this is false is denied on every call, so it need not be shown.
    pub fn could_allow(&self, request: &Request) -> bool {
        let Some((cedar, entities, action, resource)) = cedar_request(&self.names, request) else {
            return true; // unknown: show it, and let each call be decided
        };
        let slice = self.reach.slice(&action, &resource);
        let response = self.authorizer.is_authorized(&cedar, slice, &entities);
        response.decision() == cedar_policy::Decision::Allow
    }

    /// A matched forbid's `@reason`, or words that name it.
    fn reason(&self, id: &PolicyId) -> String {
        self.facts
            .get(id)
            .and_then(|f| f.reason.clone())
            .unwrap_or_else(|| format!("forbidden by policy {id}"))
    }
}

/// The policies that say what a call could reach, whatever its arguments and its run:
/// a condition that reads `context` depends on the call, the others only on who calls
/// what. Each permit keeps the conditions that do not read `context` (it allows some call
/// there, or none); each forbid none of whose conditions reads `context` is kept whole (it
/// denies every call there); a forbid that reads `context` denies only some calls, so it
/// hides nothing. A policy that cannot be rewritten is kept whole.
fn reach_of(set: &PolicySet) -> PolicySet {
    let mut reach = PolicySet::new();
    for policy in set.policies() {
        let kept = match (policy.effect(), policy.has_non_scope_constraint()) {
            (_, false) => Some(policy.clone()),
            (Effect::Forbid, true) => without_context(policy, true),
            (Effect::Permit, true) => without_context(policy, false),
        };
        if let Some(policy) = kept {
            // Ids are unique in `set`, so adding cannot fail.
            let _ = reach.add(policy);
        }
    }
    reach
}

/// `policy` without its conditions that read `context`; `None` for a forbid with one
/// (`whole`: a forbid is kept whole or not at all).
fn without_context(policy: &Policy, whole: bool) -> Option<Policy> {
    let Ok(mut json) = policy.to_json() else {
        return Some(policy.clone());
    };
    let Some(conditions) = json["conditions"].as_array().cloned() else {
        return Some(policy.clone());
    };
    let kept: Vec<serde_json::Value> = conditions
        .into_iter()
        .filter(|c| !reads_context(c))
        .collect();
    if whole {
        let all = json["conditions"].as_array().map_or(0, Vec::len);
        return (kept.len() == all).then(|| policy.clone());
    }
    json["conditions"] = serde_json::Value::Array(kept);
    Some(Policy::from_json(Some(policy.id().clone()), json).unwrap_or_else(|_| policy.clone()))
}

/// True when a policy's JSON expression reads the `context` variable anywhere.
fn reads_context(expression: &serde_json::Value) -> bool {
    match expression {
        serde_json::Value::Object(fields) => fields
            .iter()
            .any(|(key, value)| (key == "Var" && value == "context") || reads_context(value)),
        serde_json::Value::Array(items) => items.iter().any(reads_context),
        _ => false,
    }
}

/// The verdict with its policies sorted, so the same call always reads the same.
fn verdict(decision: Decision, mut policies: Vec<String>, reasons: Vec<String>) -> Verdict {
    policies.sort();
    Verdict {
        decision,
        policies,
        reasons,
    }
}

/// Cedar's text for a policy that failed, without the values it may quote: an overflow
/// or a failed extension function names the argument's value, which may be a secret.
fn safe_text(error: &EvaluationError) -> String {
    match error {
        EvaluationError::EntityDoesNotExist(_)
        | EvaluationError::EntityAttrDoesNotExist(_)
        | EvaluationError::RecordAttrDoesNotExist(_)
        | EvaluationError::TypeError(_)
        | EvaluationError::WrongNumArguments(_)
        | EvaluationError::RecursionLimit(_) => error.to_string(),
        EvaluationError::IntegerOverflow(_) => "integer overflow".to_string(),
        EvaluationError::FailedExtensionFunctionExecution(_) => {
            "an extension function (decimal, ip, datetime) failed on its input".to_string()
        }
        _ => "the policy could not be evaluated".to_string(),
    }
}

/// A call as Cedar asks it.
type CedarCall = (cedar_policy::Request, Entities, EntityUid, EntityUid);

/// The Cedar request and entities of a call, with its action and resource; `None` if the
/// arguments cannot be a record.
fn cedar_request(names: &Names, request: &Request) -> Option<CedarCall> {
    let token = match &request.token {
        Some(t) => Some(names.uid("Token", t)?),
        None => None,
    };
    let agent = names.uid("Agent", &request.agent)?;
    let tags = |tags: &[String]| {
        RestrictedExpression::new_set(tags.iter().cloned().map(RestrictedExpression::new_string))
    };
    let agent_entity = Entity::new(
        agent.clone(),
        HashMap::from([("tags".to_string(), tags(&request.agent_tags))]),
        token.iter().cloned().collect::<HashSet<_>>(),
    )
    .ok()?;
    let (kind, id) = request.target.entity();
    let resource = names.uid(kind, id)?;
    let resource_entity = match &request.target {
        Target::Tool {
            server,
            name,
            effect,
            ..
        } => {
            let string = |s: &String| RestrictedExpression::new_string(s.clone());
            let attrs = HashMap::from([
                ("server".to_string(), string(server)),
                ("name".to_string(), string(name)),
                ("effect".to_string(), string(effect)),
            ]);
            Entity::new(resource.clone(), attrs, HashSet::new()).ok()?
        }
        _ => Entity::new_no_attrs(resource.clone(), HashSet::new()),
    };
    let mut entities = vec![agent_entity, resource_entity];
    entities.extend(token.map(|t| Entity::new_no_attrs(t, HashSet::new())));
    let entities = Entities::from_entities(entities, None).ok()?;
    let run = RestrictedExpression::new_record([
        (
            "id".to_string(),
            RestrictedExpression::new_string(request.run.id.clone()),
        ),
        ("tags".to_string(), tags(&request.run.tags)),
        (
            "step".to_string(),
            RestrictedExpression::new_long(request.run.step),
        ),
    ])
    .ok()?;
    let context = Context::from_pairs([
        ("arguments".to_string(), record(&request.arguments)?),
        ("run".to_string(), run),
        (
            "host".to_string(),
            RestrictedExpression::new_string(request.host.clone()),
        ),
    ])
    .ok()?;
    let action = names.uid("Action", request.target.action())?;
    // No schema here: the arguments are whatever the tool takes (docs/policy.md).
    let cedar =
        cedar_policy::Request::new(agent, action.clone(), resource.clone(), context, None).ok()?;
    Some((cedar, entities, action, resource))
}

/// The schema's entity type names, parsed once per policy set.
struct Names(HashMap<&'static str, EntityTypeName>);

impl Names {
    fn new() -> Result<Self, PolicyError> {
        let mut names = HashMap::new();
        for kind in ["Token", "Agent", "Tool", "Model", "Secret", "Action"] {
            let name = EntityTypeName::from_str(kind)
                .map_err(|e| PolicyError::Schema(format!("entity type {kind}: {e}")))?;
            names.insert(kind, name);
        }
        Ok(Self(names))
    }

    /// `Kind::"id"`; `None` only for a kind the schema does not name, which is a bug.
    fn uid(&self, kind: &str, id: &str) -> Option<EntityUid> {
        let name = self.0.get(kind)?.clone();
        Some(EntityUid::from_type_name_and_id(name, EntityId::new(id)))
    }
}

#[cfg(test)]
mod tests;
