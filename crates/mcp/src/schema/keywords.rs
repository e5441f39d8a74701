//! The keywords a schema level may hold: the structure and narrowing ones kept (after a
//! shape check), and the validation ones that refuse the tool.

use serde_json::{Map, Value};

use super::refusal::{SchemaRefusal, malformed};

/// Keywords that hold or shape schemas, kept at every level (M8).
pub(super) const STRUCTURE: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "items",
];

/// M8 (amended): keywords that narrow what a model may send, kept as they are (after a
/// shape check), plus the annotations `description`, `title` and `default` that tell the
/// model what to send. Dropping any of the narrowing ones would widen the tool.
pub(super) const CONSTRAINTS: &[&str] = &[
    "description",
    "title",
    "default",
    "const",
    "enum",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
];

/// M8 (amended): validation keywords that cannot be kept for providers and cannot be
/// dropped without widening what the tool accepts, so the whole tool is refused.
/// (`$ref` is not here: a local, acyclic one is inlined.)
pub(super) const FORBIDDEN: &[&str] = &[
    "$dynamicRef",
    "$recursiveRef",
    "if",
    "then",
    "else",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "unevaluatedProperties",
    "patternProperties",
    "propertyNames",
    "dependentSchemas",
    "dependentRequired",
    "dependencies",
];

/// The JSON types a `type` keyword may name.
pub(super) const JSON_TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "object", "array", "null",
];

/// Refuses a schema level that uses a keyword in [`FORBIDDEN`] (M8).
pub(super) fn forbid(level: &Map<String, Value>, path: &str) -> Result<(), SchemaRefusal> {
    match level.keys().find(|k| FORBIDDEN.contains(&k.as_str())) {
        Some(keyword) => Err(SchemaRefusal::Forbidden {
            keyword: keyword.clone(),
            path: path.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Checks the shape of a kept constraint or annotation, which is then kept as it is.
pub(super) fn check_constraint(
    key: &str,
    value: &Value,
    path: String,
) -> Result<Value, SchemaRefusal> {
    let fits = match key {
        "description" | "title" | "pattern" | "format" => value.is_string(),
        "enum" => value.is_array(),
        // Draft 4 writes exclusive bounds as a boolean beside minimum/maximum.
        "exclusiveMinimum" | "exclusiveMaximum" => value.is_number() || value.is_boolean(),
        "minimum" | "maximum" => value.is_number(),
        "multipleOf" => value.as_f64().is_some_and(|n| n > 0.0),
        "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => {
            value.is_u64()
        }
        "uniqueItems" => value.is_boolean(),
        // `const` and `default` may be any JSON value.
        _ => true,
    };
    if fits {
        return Ok(value.clone());
    }
    let problem = match key {
        "description" | "title" | "pattern" | "format" => "must be a string",
        "enum" => "must be a list",
        "exclusiveMinimum" | "exclusiveMaximum" => "must be a number",
        "minimum" | "maximum" => "must be a number",
        "multipleOf" => "must be a number greater than 0",
        "uniqueItems" => "must be true or false",
        _ => "must be a non-negative integer",
    };
    Err(malformed(path, problem))
}

/// Checks that `type` is a known JSON type or a list of them.
pub(super) fn check_type(value: &Value, path: String) -> Result<Value, SchemaRefusal> {
    let names: Vec<&Value> = match value {
        Value::String(_) => vec![value],
        Value::Array(names) if !names.is_empty() => names.iter().collect(),
        _ => return Err(malformed(path, "must be a string or list of strings")),
    };
    for name in names {
        let Some(name) = name.as_str() else {
            return Err(malformed(path, "must be a string or list of strings"));
        };
        if !JSON_TYPES.contains(&name) {
            return Err(malformed(path, format!("names an unknown type {name:?}")));
        }
    }
    Ok(value.clone())
}
