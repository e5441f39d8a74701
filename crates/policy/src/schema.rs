//! The schema runwarden ships with, and the one exception its validation makes: an
//! attribute read from `context.arguments`, whose names are the tool's, not ours.

use std::sync::OnceLock;

use cedar_policy::{Schema, ValidationError, Validator};

use crate::error::PolicyError;

/// The schema policies are checked against, in Cedar's schema format.
pub const SCHEMA: &str = include_str!("schema.cedarschema");

/// The ships-with schema's validator, parsed once.
pub(crate) fn validator() -> Result<&'static Validator, PolicyError> {
    static VALIDATOR: OnceLock<Result<Validator, String>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| {
            Schema::from_cedarschema_str(SCHEMA)
                .map(|(schema, _warnings)| Validator::new(schema))
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PolicyError::Schema(e.clone()))
}

/// True when the validator's error is about an attribute read from the call's arguments
/// (`context.arguments.path`, `context.arguments["a b"]`), which the schema cannot know:
/// arguments are whatever the tool takes. `spanned` is the source text the error points
/// at. Every other attribute, of an entity or of the rest of the context, stays checked.
pub(crate) fn reads_an_argument(error: &ValidationError, spanned: &str) -> bool {
    if !matches!(error, ValidationError::UnsafeAttributeAccess(_)) {
        return false;
    }
    let text: String = spanned.chars().filter(|c| !c.is_whitespace()).collect();
    ["context.arguments", "context[\"arguments\"]"]
        .iter()
        .any(|head| {
            text.strip_prefix(head)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
        })
}
