//! M8: the normaliser that turns a remote tool's input schema into one every model
//! provider accepts, or refuses the tool with the reason.
//!
//! The normaliser is a pure function of the schema it is given: it never fetches
//! anything (M8), and the same input always gives the same output, byte for byte.

use serde_json::{Map, Value};

/// The deepest schema the normaliser accepts. The top-level schema is at depth 1 and
/// each nested schema (a property's value, an `allOf`/`anyOf`/`oneOf` entry, `not`,
/// `items`, or an `additionalProperties` schema) is one deeper than the schema that
/// holds it.
pub const MAX_DEPTH: usize = 12;

/// The largest normalised schema the normaliser accepts, in bytes of compact JSON.
pub const MAX_ENCODED_BYTES: usize = 16 * 1024;

/// Keywords kept at every level; everything else not in [`FORBIDDEN`] is dropped.
///
/// M8 lists type, description, properties, required, additionalProperties, allOf,
/// anyOf, oneOf and not. We also keep `items` and `enum`, a deliberate deviation:
/// without `items` an array argument loses its element type, and without `enum` the
/// model loses the closed set of values a tool accepts. Every provider supports both.
const KEPT: &[&str] = &[
    "type",
    "description",
    "properties",
    "required",
    "additionalProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "items",
    "enum",
];

/// Keywords that make the whole tool refused rather than repaired (M8): dropping them
/// would silently change what the tool accepts, and providers cannot follow them.
const FORBIDDEN: &[&str] = &[
    "$ref",
    "$dynamicRef",
    "$defs",
    "definitions",
    "if",
    "then",
    "else",
    "patternProperties",
    "propertyNames",
    "dependentSchemas",
    "dependentRequired",
    "unevaluatedProperties",
];

/// The JSON types a `type` keyword may name.
const JSON_TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "object", "array", "null",
];

/// Why a tool's input schema was refused; the tool is then not offered to providers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaRefusal {
    /// The top-level schema is not an object with `type: "object"`.
    #[error("the top-level schema must be an object with type \"object\"; the tool is refused")]
    NotAnObjectSchema,
    /// The schema uses a keyword that providers cannot follow (M8).
    #[error(
        "the schema uses {keyword} {}, which providers cannot follow; the tool is refused",
        at(.path)
    )]
    Forbidden {
        /// The forbidden keyword, e.g. `$ref`.
        keyword: String,
        /// Where the schema using it sits, e.g. `properties.address`; empty at the top.
        path: String,
    },
    /// A schema nests deeper than [`MAX_DEPTH`].
    #[error(
        "the schema nests deeper than {limit} levels {}; the tool is refused",
        at(.path)
    )]
    TooDeep {
        /// The depth limit, [`MAX_DEPTH`].
        limit: usize,
        /// Where the first too-deep schema sits.
        path: String,
    },
    /// The normalised schema is larger than [`MAX_ENCODED_BYTES`].
    #[error(
        "the normalised schema is {size} bytes, over the limit of {limit}; the tool is refused"
    )]
    TooLarge {
        /// The size of the normalised schema as compact JSON.
        size: usize,
        /// The size limit, [`MAX_ENCODED_BYTES`].
        limit: usize,
    },
    /// A kept keyword has a shape providers would reject, e.g. a `required` that is not
    /// a list of strings.
    #[error("{path} {problem}; the tool is refused")]
    Malformed {
        /// The offending keyword's path, e.g. `properties.address.type`.
        path: String,
        /// What is wrong, e.g. `must be a string or list of strings`.
        problem: String,
    },
}

/// Renders where a schema sits for an error message.
fn at(path: &str) -> String {
    if path.is_empty() {
        "at the top level".to_owned()
    } else {
        format!("at {path}")
    }
}

/// Normalises a remote tool's input schema for model providers (M8), or says why the
/// tool must be refused.
///
/// - The top level must be an object with `type: "object"`. The empty schema `{}`,
///   which many servers send for tools without arguments, becomes
///   `{"type":"object","properties":{}}`; a top level without `properties` gets an
///   empty one, which changes nothing a provider accepts.
/// - Every level keeps only the keywords in M8 plus `items` and `enum`; other keywords
///   (`format`, `default`, `title`, `$schema`, `minimum`, ...) are dropped silently.
/// - A forbidden keyword (`$ref`, `$defs`, `if`, `patternProperties`, ...) at any level
///   refuses the whole tool, as do schemas deeper than [`MAX_DEPTH`], a normalised
///   schema over [`MAX_ENCODED_BYTES`], and malformed kept keywords.
///
/// Keys keep the order of the input's map, so the output depends on the input alone.
pub fn normalise_input_schema(schema: &Value) -> Result<Value, SchemaRefusal> {
    let Value::Object(top) = schema else {
        return Err(SchemaRefusal::NotAnObjectSchema);
    };
    // M8: `{}` is how many servers say "no arguments"; read it as an empty object.
    if top.is_empty() {
        return Ok(empty_object_schema());
    }
    forbid(top, "")?;
    // M8: the top level must be `type: "object"`. A schema that has `properties` but no
    // `type` is refused too: guessing the type is a repair, and M8 asks for a refusal.
    if top.get("type").and_then(Value::as_str) != Some("object") {
        return Err(SchemaRefusal::NotAnObjectSchema);
    }
    let mut normalised = normalise_level(top, "", 1)?;
    if !normalised.contains_key("properties") {
        normalised.insert("properties".to_owned(), Value::Object(Map::new()));
    }
    let normalised = Value::Object(normalised);
    // M8: size is measured on the normalised schema; `to_string` writes the same
    // compact bytes as `serde_json::to_vec` and cannot fail on a `Value`.
    let size = normalised.to_string().len();
    if size > MAX_ENCODED_BYTES {
        return Err(SchemaRefusal::TooLarge {
            size,
            limit: MAX_ENCODED_BYTES,
        });
    }
    Ok(normalised)
}

fn empty_object_schema() -> Value {
    let mut map = Map::new();
    map.insert("type".to_owned(), Value::from("object"));
    map.insert("properties".to_owned(), Value::Object(Map::new()));
    Value::Object(map)
}

/// Joins a path and a key with a dot, leaving no dot at the top level.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn malformed(path: String, problem: impl Into<String>) -> SchemaRefusal {
    SchemaRefusal::Malformed {
        path,
        problem: problem.into(),
    }
}

/// Normalises a nested schema, which must be a JSON object.
fn normalise_schema(value: &Value, path: String, depth: usize) -> Result<Value, SchemaRefusal> {
    // M8: checked before looking inside, so recursion never goes past MAX_DEPTH + 1.
    if depth > MAX_DEPTH {
        return Err(SchemaRefusal::TooDeep {
            limit: MAX_DEPTH,
            path,
        });
    }
    match value {
        Value::Object(level) => Ok(Value::Object(normalise_level(level, &path, depth)?)),
        _ => Err(malformed(path, "must be a schema object")),
    }
}

/// Normalises one schema level: refuses forbidden keywords, drops unknown ones and
/// recurses into the kept keywords that hold schemas.
fn normalise_level(
    level: &Map<String, Value>,
    path: &str,
    depth: usize,
) -> Result<Map<String, Value>, SchemaRefusal> {
    // M8: refuse before normalising anything, so a forbidden keyword wins over any
    // other problem at the same level.
    forbid(level, path)?;
    let mut out = Map::new();
    for (key, value) in level {
        if !KEPT.contains(&key.as_str()) {
            continue; // M8: unknown keywords are dropped silently.
        }
        let here = join(path, key);
        let kept = match key.as_str() {
            "type" => check_type(value, here)?,
            "description" => match value {
                Value::String(_) => value.clone(),
                _ => return Err(malformed(here, "must be a string")),
            },
            "required" => match value {
                Value::Array(names) if names.iter().all(Value::is_string) => value.clone(),
                _ => return Err(malformed(here, "must be a list of strings")),
            },
            "enum" => match value {
                Value::Array(_) => value.clone(),
                _ => return Err(malformed(here, "must be a list")),
            },
            "properties" => {
                let Value::Object(properties) = value else {
                    return Err(malformed(here, "must be an object of schemas"));
                };
                let mut kept = Map::new();
                for (name, property) in properties {
                    let property = normalise_schema(property, join(&here, name), depth + 1)?;
                    kept.insert(name.clone(), property);
                }
                Value::Object(kept)
            }
            "additionalProperties" => match value {
                Value::Bool(_) => value.clone(),
                _ => normalise_schema(value, here, depth + 1)?,
            },
            "allOf" | "anyOf" | "oneOf" => {
                let Value::Array(entries) = value else {
                    return Err(malformed(here, "must be a non-empty list of schemas"));
                };
                if entries.is_empty() {
                    return Err(malformed(here, "must be a non-empty list of schemas"));
                }
                let mut kept = Vec::with_capacity(entries.len());
                for (i, entry) in entries.iter().enumerate() {
                    kept.push(normalise_schema(entry, format!("{here}[{i}]"), depth + 1)?);
                }
                Value::Array(kept)
            }
            // `items` must be one schema: the tuple form (a list) is not something
            // providers accept, and dropping it would widen what the tool accepts.
            "not" | "items" => normalise_schema(value, here, depth + 1)?,
            _ => continue,
        };
        out.insert(key.clone(), kept);
    }
    Ok(out)
}

/// Refuses a schema level that uses a keyword in [`FORBIDDEN`] (M8).
fn forbid(level: &Map<String, Value>, path: &str) -> Result<(), SchemaRefusal> {
    match level.keys().find(|k| FORBIDDEN.contains(&k.as_str())) {
        Some(keyword) => Err(SchemaRefusal::Forbidden {
            keyword: keyword.clone(),
            path: path.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Checks that `type` is a known JSON type or a list of them.
fn check_type(value: &Value, path: String) -> Result<Value, SchemaRefusal> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refusal(schema: Value) -> SchemaRefusal {
        match normalise_input_schema(&schema) {
            Ok(normalised) => panic!("expected a refusal, got {normalised}"),
            Err(refusal) => refusal,
        }
    }

    /// A schema `depth` levels deep: the top level plus `depth - 1` nested properties.
    fn nested(depth: usize) -> Value {
        let mut schema = json!({"type": "string"});
        for _ in 1..depth {
            schema = json!({"type": "object", "properties": {"a": schema}});
        }
        schema
    }

    #[test]
    fn an_empty_schema_becomes_an_empty_object() {
        let normalised = normalise_input_schema(&json!({})).expect("accepted");
        assert_eq!(normalised, json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn a_top_level_without_properties_gets_empty_properties() {
        let normalised = normalise_input_schema(&json!({"type": "object"})).expect("accepted");
        assert_eq!(normalised, json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn the_top_level_must_be_an_object_type() {
        for schema in [
            json!(null),
            json!(true),
            json!([]),
            json!({"type": "string"}),
            json!({"type": ["object", "null"]}),
            json!({"properties": {"a": {"type": "string"}}}),
        ] {
            assert_eq!(refusal(schema), SchemaRefusal::NotAnObjectSchema);
        }
    }

    #[test]
    fn a_top_level_ref_is_refused_as_a_ref_even_without_a_type() {
        let refused = refusal(json!({"$ref": "https://example.com/schema.json"}));
        assert!(matches!(refused, SchemaRefusal::Forbidden { keyword, .. } if keyword == "$ref"));
    }

    #[test]
    fn unknown_keywords_are_dropped_not_refused() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Search",
            "type": "object",
            "properties": {
                "query": {"type": "string", "format": "uri", "minLength": 1, "default": "x"},
                "limit": {"type": "integer", "minimum": 1, "examples": [5]}
            },
            "required": ["query"],
            "additionalProperties": false
        });
        let normalised = normalise_input_schema(&schema).expect("accepted");
        assert_eq!(
            normalised,
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"}
                },
                "required": ["query"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn items_and_enum_are_kept_and_items_is_normalised() {
        let schema = json!({
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 9}},
                "mode": {"type": "string", "enum": ["fast", "slow"]}
            }
        });
        let normalised = normalise_input_schema(&schema).expect("accepted");
        assert_eq!(
            normalised,
            json!({
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "mode": {"type": "string", "enum": ["fast", "slow"]}
                }
            })
        );
    }

    #[test]
    fn combinators_not_and_additional_properties_schemas_are_normalised() {
        let schema = json!({
            "type": "object",
            "properties": {
                "v": {
                    "anyOf": [{"type": "string", "pattern": "x"}, {"type": "null"}],
                    "not": {"type": "integer", "title": "t"}
                }
            },
            "additionalProperties": {"type": "number", "maximum": 3}
        });
        let normalised = normalise_input_schema(&schema).expect("accepted");
        assert_eq!(
            normalised,
            json!({
                "type": "object",
                "properties": {
                    "v": {"anyOf": [{"type": "string"}, {"type": "null"}], "not": {"type": "integer"}}
                },
                "additionalProperties": {"type": "number"}
            })
        );
    }

    #[test]
    fn a_property_named_like_a_forbidden_keyword_is_not_refused() {
        let schema =
            json!({"type": "object", "properties": {"$ref": {"type": "string"}, "if": {}}});
        assert!(normalise_input_schema(&schema).is_ok());
    }

    #[test]
    fn a_ref_anywhere_refuses_the_whole_tool() {
        let refused = refusal(json!({
            "type": "object",
            "properties": {"address": {"$ref": "#/$defs/address"}}
        }));
        assert_eq!(
            refused,
            SchemaRefusal::Forbidden {
                keyword: "$ref".to_owned(),
                path: "properties.address".to_owned()
            }
        );
        assert_eq!(
            refused.to_string(),
            "the schema uses $ref at properties.address, which providers cannot follow; \
             the tool is refused"
        );
    }

    #[test]
    fn every_forbidden_keyword_at_the_top_level_refuses_the_tool() {
        for &keyword in FORBIDDEN {
            let mut schema = json!({"type": "object", "properties": {}});
            schema[keyword] = json!({});
            assert_eq!(
                refusal(schema),
                SchemaRefusal::Forbidden {
                    keyword: keyword.to_owned(),
                    path: String::new()
                },
                "{keyword}"
            );
        }
    }

    #[test]
    fn every_forbidden_keyword_inside_a_property_refuses_the_tool() {
        for &keyword in FORBIDDEN {
            let mut inner = json!({"type": "object"});
            inner[keyword] = json!({});
            let schema = json!({"type": "object", "properties": {"p": inner}});
            assert_eq!(
                refusal(schema),
                SchemaRefusal::Forbidden {
                    keyword: keyword.to_owned(),
                    path: "properties.p".to_owned()
                },
                "{keyword}"
            );
        }
    }

    #[test]
    fn every_forbidden_keyword_inside_any_of_refuses_the_tool() {
        for &keyword in FORBIDDEN {
            let mut inner = json!({"type": "string"});
            inner[keyword] = json!({});
            let schema = json!({
                "type": "object",
                "properties": {"p": {"anyOf": [{"type": "null"}, inner]}}
            });
            assert_eq!(
                refusal(schema),
                SchemaRefusal::Forbidden {
                    keyword: keyword.to_owned(),
                    path: "properties.p.anyOf[1]".to_owned()
                },
                "{keyword}"
            );
        }
    }

    #[test]
    fn forbidden_keywords_inside_items_not_and_additional_properties_refuse_the_tool() {
        for (schema, path) in [
            (
                json!({"type": "object", "properties": {"l": {"type": "array", "items": {"$ref": "#"}}}}),
                "properties.l.items",
            ),
            (
                json!({"type": "object", "properties": {"n": {"not": {"if": {}}}}}),
                "properties.n.not",
            ),
            (
                json!({"type": "object", "additionalProperties": {"$defs": {}}}),
                "additionalProperties",
            ),
        ] {
            assert!(
                matches!(refusal(schema), SchemaRefusal::Forbidden { path: p, .. } if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn depth_twelve_is_accepted() {
        assert!(normalise_input_schema(&nested(MAX_DEPTH)).is_ok());
    }

    #[test]
    fn depth_thirteen_is_refused() {
        let refused = refusal(nested(MAX_DEPTH + 1));
        assert!(matches!(refused, SchemaRefusal::TooDeep { limit: 12, .. }));
        assert!(refused.to_string().contains("deeper than 12 levels"));
    }

    #[test]
    fn a_schema_over_16_kib_after_normalising_is_refused() {
        let description = "d".repeat(MAX_ENCODED_BYTES);
        let refused = refusal(json!({"type": "object", "description": description}));
        assert!(
            matches!(refused, SchemaRefusal::TooLarge { size, limit: 16384 } if size > 16384),
            "{refused:?}"
        );
    }

    #[test]
    fn size_is_measured_after_dropping_keywords() {
        let schema = json!({"type": "object", "title": "t".repeat(2 * MAX_ENCODED_BYTES)});
        assert!(normalise_input_schema(&schema).is_ok());
    }

    #[test]
    fn malformed_shapes_are_refused_naming_the_path() {
        for (schema, message) in [
            (
                json!({"type": "object", "properties": {"address": {"type": 3}}}),
                "properties.address.type must be a string or list of strings",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "int"}}}),
                "properties.a.type names an unknown type \"int\"",
            ),
            (
                json!({"type": "object", "required": "a"}),
                "required must be a list of strings",
            ),
            (
                json!({"type": "object", "required": ["a", 1]}),
                "required must be a list of strings",
            ),
            (
                json!({"type": "object", "properties": []}),
                "properties must be an object of schemas",
            ),
            (
                json!({"type": "object", "properties": {"a": "string"}}),
                "properties.a must be a schema object",
            ),
            (
                json!({"type": "object", "properties": {"a": {"anyOf": []}}}),
                "properties.a.anyOf must be a non-empty list of schemas",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "items": [{}]}}}),
                "properties.a.items must be a schema object",
            ),
        ] {
            assert_eq!(
                refusal(schema).to_string(),
                format!("{message}; the tool is refused")
            );
        }
    }

    #[test]
    fn normalising_is_deterministic_and_idempotent() {
        let schema = json!({
            "type": "object",
            "properties": {"b": {"type": "string"}, "a": {"type": ["integer", "null"]}},
            "required": ["b"]
        });
        let once = normalise_input_schema(&schema).expect("accepted");
        let again = normalise_input_schema(&schema).expect("accepted");
        assert_eq!(once.to_string(), again.to_string());
        let twice = normalise_input_schema(&once).expect("accepted");
        assert_eq!(once.to_string(), twice.to_string());
    }
}
