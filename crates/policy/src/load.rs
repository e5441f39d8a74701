//! Reading policy files: each policy gets its id (its `@id`, else FILE:LINE), its
//! annotations are checked, and every policy is validated against the schema, each
//! problem named by file and line.

use std::collections::HashMap;

use cedar_policy::{Effect, Policy, PolicyId, PolicySet};
use miette::Diagnostic;

use crate::error::{PolicyError, Problem};
use crate::schema::{reads_an_argument, validator};

/// The annotation that names a policy.
pub(crate) const ID: &str = "id";
/// The annotation that says why a policy decides as it does.
pub(crate) const REASON: &str = "reason";
/// The annotation that makes a permit require an operator's approval.
pub(crate) const APPROVAL: &str = "approval";

/// One policy file's text, and the name problems and ids call it by.
#[derive(Debug, Clone)]
pub struct PolicyFile {
    /// How an operator finds the file: the path as configured or given.
    pub name: String,
    /// The file's text.
    pub text: String,
}

/// Every policy of the files with its final id; the problems found, if any.
pub(crate) fn load(files: &[PolicyFile]) -> Result<PolicySet, PolicyError> {
    let validator = validator()?;
    let mut problems = Vec::new();
    let mut set = PolicySet::new();
    // Where each id was first seen, to name both places of a repeated id.
    let mut seen: HashMap<String, String> = HashMap::new();
    for file in files {
        let Some(policies) = parse(file, &mut problems) else {
            continue;
        };
        let mut this_file = PolicySet::new();
        for (policy, line) in policies {
            let id = policy
                .annotation(ID)
                .map(str::to_string)
                .unwrap_or_else(|| format!("{}:{line}", file.name));
            let here = format!("{}:{line}", file.name);
            if let Some(first) = seen.insert(id.clone(), here.clone()) {
                let message = format!(
                    "the policy id {id:?} is already used at {first}; give each policy its own @id"
                );
                problems.push(problem(file, line, message));
                continue;
            }
            check_annotations(&policy, file, line, &mut problems);
            let policy = policy.new_id(PolicyId::new(id));
            // Ids are distinct (checked above), so adding cannot fail.
            let _ = this_file.add(policy.clone());
            let _ = set.add(policy);
        }
        let result = validator.validate(&this_file, cedar_policy::ValidationMode::Strict);
        for error in result.validation_errors() {
            let (offset, len) = span(error);
            let spanned = file.text.get(offset..offset + len).unwrap_or("");
            if reads_an_argument(error, spanned) {
                continue;
            }
            problems.push(problem(file, line_of(&file.text, offset), with_help(error)));
        }
    }
    if problems.is_empty() {
        Ok(set)
    } else {
        Err(PolicyError::Invalid(problems))
    }
}

/// The file's policies in order, each with its first line; `None` when it does not parse
/// (its problems recorded).
fn parse(file: &PolicyFile, problems: &mut Vec<Problem>) -> Option<Vec<(Policy, usize)>> {
    let parsed: PolicySet = match file.text.parse() {
        Ok(set) => set,
        Err(error) => {
            let errors: &cedar_policy::ParseErrors = &error;
            for one in errors.iter() {
                let (offset, _) = span(one);
                problems.push(problem(file, line_of(&file.text, offset), with_help(one)));
            }
            return None;
        }
    };
    if let Some(template) = parsed.templates().next() {
        let line = find_line(&file.text, 0, &template.to_cedar()).0;
        let message = "a policy with a slot (?principal, ?resource) is a template, which runwarden does not use; name the entity instead".to_string();
        problems.push(problem(file, line, message));
        return None;
    }
    // Cedar names a file's policies policy0, policy1, ... in the order they are written.
    let mut cursor = 0;
    let mut policies = Vec::new();
    for i in 0..parsed.policies().count() {
        let Some(policy) = parsed.policy(&PolicyId::new(format!("policy{i}"))) else {
            continue;
        };
        let text = policy.to_cedar().unwrap_or_default();
        let (line, end) = find_line(&file.text, cursor, &text);
        cursor = end;
        policies.push((policy.clone(), line));
    }
    Some(policies)
}

/// Only `@id`, `@reason` and `@approval` are read (a misspelt `@aproval` would turn an
/// approval into a plain allow, so it is refused); `@approval` takes only "required", and
/// only on a permit.
fn check_annotations(policy: &Policy, file: &PolicyFile, line: usize, out: &mut Vec<Problem>) {
    for (key, _) in policy.annotations() {
        if ![ID, REASON, APPROVAL].contains(&key) {
            let message = format!(
                "unknown annotation @{key}: runwarden reads @{ID}, @{REASON} and @{APPROVAL}"
            );
            out.push(problem(file, line, message));
        }
    }
    let Some(value) = policy.annotation(APPROVAL) else {
        return;
    };
    if value != "required" {
        let message =
            format!("@approval({value:?}) is not understood; write @approval(\"required\")");
        out.push(problem(file, line, message));
    } else if policy.effect() == Effect::Forbid {
        let message =
            "@approval(\"required\") is for a permit policy; a forbid denies whatever it says"
                .to_string();
        out.push(problem(file, line, message));
    }
}

fn problem(file: &PolicyFile, line: usize, message: String) -> Problem {
    Problem {
        file: file.name.clone(),
        line,
        message,
    }
}

/// The error's text, and its advice when it has some ("did you mean `tags`?").
fn with_help(error: &dyn Diagnostic) -> String {
    match error.help() {
        Some(help) => format!("{error}; {help}"),
        None => error.to_string(),
    }
}

/// Where in the file the error points: its first label's offset and length.
fn span(error: &dyn Diagnostic) -> (usize, usize) {
    error
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| (label.offset(), label.len()))
        .unwrap_or((0, 0))
}

/// The line (from 1) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The line where `needle` first occurs at or after `from`, and where it ends; line 1 and
/// `from` itself when it is not found.
fn find_line(text: &str, from: usize, needle: &str) -> (usize, usize) {
    match text.get(from..).and_then(|rest| rest.find(needle)) {
        Some(at) if !needle.is_empty() => (line_of(text, from + at), from + at + needle.len()),
        _ => (line_of(text, from), from),
    }
}
