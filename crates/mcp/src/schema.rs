//! M8 (amended): the normaliser that turns a remote tool's input schema into one every
//! model provider accepts, or refuses the tool with the reason.
//!
//! The normaliser is a pure function of the schema it is given: it never fetches
//! anything (M8), and the same input always gives the same output, byte for byte. Local
//! references (`#/$defs/...`, `#/definitions/...`, any JSON pointer into the same
//! document) are inlined when they form no cycle; the result must stay within
//! [`MAX_DEPTH`] and [`MAX_ENCODED_BYTES`]. It never silently widens what the tool
//! accepts: a keyword that narrows what a model may send is kept, or the tool is refused.

use serde_json::{Map, Value};

/// The deepest schema the normaliser accepts. The top-level schema is at depth 1 and
/// each nested schema (a property's value, an `allOf`/`anyOf`/`oneOf` entry, `not`,
/// `items`, or an `additionalProperties` schema) is one deeper than the schema that
/// holds it. An inlined reference sits at the depth of the `$ref` it replaces.
pub const MAX_DEPTH: usize = 12;

/// The largest normalised schema the normaliser accepts, in bytes of compact JSON.
pub const MAX_ENCODED_BYTES: usize = 16 * 1024;

/// The most schema objects a normalised schema may hold. Every schema object takes at
/// least two bytes (`{}`), so a schema past this count is over [`MAX_ENCODED_BYTES`]
/// anyway; counting while inlining stops a small schema whose references fan out (each
/// definition naming the next one twice) long before it is built.
pub const MAX_SCHEMAS: usize = MAX_ENCODED_BYTES / 2;

/// Keywords that hold or shape schemas, kept at every level (M8).
const STRUCTURE: &[&str] = &[
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
const CONSTRAINTS: &[&str] = &[
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
const FORBIDDEN: &[&str] = &[
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
const JSON_TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "object", "array", "null",
];

/// Why a tool's input schema was refused; the tool is then not offered to providers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaRefusal {
    /// The top-level schema is not an object with `type: "object"`.
    #[error("the top-level schema must be an object with type \"object\"; the tool is refused")]
    NotAnObjectSchema,
    /// The schema uses a keyword that cannot be kept without widening what the tool
    /// accepts (M8 amended).
    #[error(
        "the schema uses {keyword} {}, which cannot be kept for model providers and cannot be dropped without widening what the tool accepts; the tool is refused",
        at(.path)
    )]
    Forbidden {
        /// The keyword, e.g. `prefixItems`, or `items` in its list (tuple) form.
        keyword: String,
        /// Where the schema using it sits, e.g. `properties.address`; empty at the top.
        path: String,
    },
    /// A `$ref` names another document; it is never fetched (M8).
    #[error(
        "the schema refers to {reference:?} {}, outside the tool's own schema; remote references are never fetched, so the tool is refused",
        at(.path)
    )]
    RemoteRef {
        /// The reference as the server wrote it (cut to 200 characters).
        reference: String,
        /// Where the `$ref` sits.
        path: String,
    },
    /// A `$ref` leads back to a schema that holds it: the schema is recursive and has no
    /// finite inlined form.
    #[error(
        "the schema is recursive: {reference:?} {} refers back to a schema that contains it; the tool is refused",
        at(.path)
    )]
    RecursiveRef {
        /// The reference that closes the cycle.
        reference: String,
        /// Where the `$ref` sits.
        path: String,
    },
    /// A local `$ref` that names nothing in the schema, or is not a JSON pointer.
    #[error(
        "the schema's reference {reference:?} {} {problem}; the tool is refused",
        at(.path)
    )]
    UnresolvedRef {
        /// The reference as the server wrote it (cut to 200 characters).
        reference: String,
        /// Where the `$ref` sits.
        path: String,
        /// What is wrong, e.g. `names nothing in the schema`.
        problem: String,
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
    /// Inlining the references would build more than [`MAX_SCHEMAS`] schema objects.
    #[error(
        "inlining the schema's references builds more than {limit} nested schemas, far over the {} byte limit; the tool is refused",
        MAX_ENCODED_BYTES
    )]
    TooManySchemas {
        /// The limit, [`MAX_SCHEMAS`].
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

/// A reference as it may appear in an error: on one line and at most 200 characters.
fn shown(reference: &str) -> String {
    reference
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

/// Normalises a remote tool's input schema for model providers (M8 amended), or says
/// why the tool must be refused.
///
/// - The top level must be an object with `type: "object"`. The empty schema `{}`,
///   which many servers send for tools without arguments, becomes
///   `{"type":"object","properties":{}}`; a top level without `properties` gets an
///   empty one, which changes nothing a provider accepts.
/// - A local `$ref` (a JSON pointer into the same document, like `#/$defs/Address`) is
///   replaced by the schema it names; keywords beside the `$ref` are kept with it, and
///   where both set the same keyword differently the target goes under `allOf`. The
///   `$defs`/`definitions` containers are then dropped. A recursive reference, a remote
///   one (never fetched) and one that names nothing refuse the tool.
/// - Every level keeps the structural keywords (`type`, `properties`, `required`,
///   `additionalProperties`, `allOf`, `anyOf`, `oneOf`, `not`, `items`) and the ones in
///   [`CONSTRAINTS`] (`const`, `enum`, `pattern`, `format`, bounds, `default`, `title`,
///   ...). Keywords that constrain nothing (`$schema`, `$comment`, `examples`, vendor
///   `x-` keys, ...) are dropped, which never widens what the tool accepts.
/// - A validation keyword that cannot be kept (`prefixItems`, `if`, `patternProperties`,
///   the list form of `items`, ...) refuses the whole tool, as do schemas deeper than
///   [`MAX_DEPTH`], a normalised schema over [`MAX_ENCODED_BYTES`], and malformed kept
///   keywords.
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
    let mut normaliser = Normaliser {
        root: schema,
        // The root is being expanded: a `$ref` to `#` from inside it is a cycle.
        expanding: vec![String::new()],
        schemas: 0,
    };
    let mut normalised = normaliser.level(top, "", 1)?;
    // M8: the top level must be `type: "object"` (after inlining a top-level `$ref`). A
    // schema that has `properties` but no `type` is refused too: guessing the type is a
    // repair, and M8 asks for a refusal.
    if normalised.get("type").and_then(Value::as_str) != Some("object") {
        return Err(SchemaRefusal::NotAnObjectSchema);
    }
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

/// One normalisation: the document references resolve in, the references being inlined
/// right now (a cycle check), and how many schema objects were built so far.
struct Normaliser<'a> {
    root: &'a Value,
    /// JSON pointers (decoded) of the schemas being expanded, outermost first.
    expanding: Vec<String>,
    schemas: usize,
}

impl<'a> Normaliser<'a> {
    /// Normalises a nested schema, which must be a JSON object.
    fn schema(
        &mut self,
        value: &'a Value,
        path: String,
        depth: usize,
    ) -> Result<Value, SchemaRefusal> {
        // M8: checked before looking inside, so recursion never goes past MAX_DEPTH + 1.
        if depth > MAX_DEPTH {
            return Err(SchemaRefusal::TooDeep {
                limit: MAX_DEPTH,
                path,
            });
        }
        match value {
            Value::Object(level) => Ok(Value::Object(self.level(level, &path, depth)?)),
            _ => Err(malformed(path, "must be a schema object")),
        }
    }

    /// Normalises one schema level: refuses forbidden keywords, inlines a `$ref`, keeps
    /// the structural and narrowing keywords, drops the rest, and recurses into the kept
    /// keywords that hold schemas.
    fn level(
        &mut self,
        level: &'a Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Map<String, Value>, SchemaRefusal> {
        self.schemas += 1;
        if self.schemas > MAX_SCHEMAS {
            return Err(SchemaRefusal::TooManySchemas { limit: MAX_SCHEMAS });
        }
        // M8: refuse before normalising anything, so a forbidden keyword wins over any
        // other problem at the same level.
        forbid(level, path)?;
        if depth > 1 && level.contains_key("$id") {
            // A nested `$id` starts a new base for the references inside it; resolving
            // them against the top would pick the wrong targets, so refuse, not guess.
            return Err(SchemaRefusal::Forbidden {
                keyword: "$id (an embedded schema resource)".to_owned(),
                path: path.to_owned(),
            });
        }
        let mut out = Map::new();
        for (key, value) in level {
            let here = join(path, key);
            let kept = match key.as_str() {
                "type" => check_type(value, here)?,
                "required" => match value {
                    Value::Array(names) if names.iter().all(Value::is_string) => value.clone(),
                    _ => return Err(malformed(here, "must be a list of strings")),
                },
                "properties" => {
                    let Value::Object(properties) = value else {
                        return Err(malformed(here, "must be an object of schemas"));
                    };
                    let mut kept = Map::new();
                    for (name, property) in properties {
                        let property = self.schema(property, join(&here, name), depth + 1)?;
                        kept.insert(name.clone(), property);
                    }
                    Value::Object(kept)
                }
                "additionalProperties" => match value {
                    Value::Bool(_) => value.clone(),
                    _ => self.schema(value, here, depth + 1)?,
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
                        kept.push(self.schema(entry, format!("{here}[{i}]"), depth + 1)?);
                    }
                    Value::Array(kept)
                }
                // M8 (amended): the list (tuple) form of `items` fixes each position's
                // type; one schema for all of them would widen it, so it is refused.
                "items" if value.is_array() => {
                    return Err(SchemaRefusal::Forbidden {
                        keyword: "items as a list (the tuple form)".to_owned(),
                        path: path.to_owned(),
                    });
                }
                "not" | "items" => self.schema(value, here, depth + 1)?,
                // Inlined below, once the level's own keywords are in.
                "$ref" => continue,
                constraint if CONSTRAINTS.contains(&constraint) => {
                    check_constraint(key, value, here)?
                }
                // `$defs`/`definitions` are only reached through `$ref`; everything else
                // left (`$schema`, `$id`, `$comment`, `examples`, `x-...`) constrains
                // nothing, so dropping it never widens the tool.
                _ => continue,
            };
            debug_assert!(STRUCTURE.contains(&key.as_str()) || CONSTRAINTS.contains(&key.as_str()));
            out.insert(key.clone(), kept);
        }
        if let Some(reference) = level.get("$ref") {
            let target = self.inline(reference, path, depth)?;
            merge(&mut out, target);
        }
        Ok(out)
    }

    /// M8 (amended): the normalised schema a local `$ref` names, or why it cannot be
    /// inlined. It sits at the depth of the `$ref` it replaces.
    fn inline(
        &mut self,
        reference: &Value,
        path: &str,
        depth: usize,
    ) -> Result<Map<String, Value>, SchemaRefusal> {
        let here = join(path, "$ref");
        let Some(reference) = reference.as_str() else {
            return Err(malformed(here, "must be a string"));
        };
        let unresolved = |problem: &str| SchemaRefusal::UnresolvedRef {
            reference: shown(reference),
            path: path.to_owned(),
            problem: problem.to_owned(),
        };
        // M8: only a fragment of this very document is followed; anything with a scheme,
        // a host or a path names another document, which is never fetched.
        let Some(fragment) = reference.strip_prefix('#') else {
            return Err(SchemaRefusal::RemoteRef {
                reference: shown(reference),
                path: path.to_owned(),
            });
        };
        if !fragment.is_empty() && !fragment.starts_with('/') {
            return Err(unresolved(
                "is a plain-name anchor; only JSON pointers like \"#/$defs/Name\" are followed",
            ));
        }
        let pointer = percent_decode(fragment)
            .ok_or_else(|| unresolved("is not a valid percent-encoded JSON pointer"))?;
        if self.expanding.contains(&pointer) {
            return Err(SchemaRefusal::RecursiveRef {
                reference: shown(reference),
                path: path.to_owned(),
            });
        }
        let Some(target) = self.root.pointer(&pointer) else {
            return Err(unresolved("names nothing in the schema"));
        };
        let Value::Object(target) = target else {
            return Err(unresolved("names something that is not a schema object"));
        };
        self.expanding.push(pointer);
        let inlined = self.level(target, path, depth);
        self.expanding.pop();
        inlined
    }
}

/// Puts an inlined target into the level that referred to it. Keywords only one side
/// sets are merged; where both set one to different values, the level's own
/// annotation wins, and any other clash keeps the whole target under `allOf`, so both
/// sides still apply (JSON Schema 2020-12: a `$ref` applies beside its siblings).
fn merge(level: &mut Map<String, Value>, target: Map<String, Value>) {
    let clash = target.iter().any(|(key, value)| {
        level.get(key).is_some_and(|own| own != value)
            && !matches!(key.as_str(), "description" | "title" | "default")
    });
    if clash {
        match level.get_mut("allOf") {
            Some(Value::Array(all)) => all.push(Value::Object(target)),
            _ => {
                level.insert(
                    "allOf".to_owned(),
                    Value::Array(vec![Value::Object(target)]),
                );
            }
        }
        return;
    }
    for (key, value) in target {
        level.entry(key).or_insert(value);
    }
}

/// Decodes `%XX` escapes of a URI fragment; `None` when an escape is broken or the
/// result is not UTF-8.
fn percent_decode(fragment: &str) -> Option<String> {
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = fragment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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

/// Checks the shape of a kept constraint or annotation, which is then kept as it is.
fn check_constraint(key: &str, value: &Value, path: String) -> Result<Value, SchemaRefusal> {
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

    fn accepted(schema: Value) -> Value {
        normalise_input_schema(&schema).unwrap_or_else(|r| panic!("refused: {r}"))
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
        assert_eq!(
            accepted(json!({})),
            json!({"type": "object", "properties": {}})
        );
    }

    #[test]
    fn a_top_level_without_properties_gets_empty_properties() {
        let normalised = accepted(json!({"type": "object"}));
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
            json!({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"}),
        ] {
            assert_eq!(refusal(schema), SchemaRefusal::NotAnObjectSchema);
        }
    }

    /// M8 (amended): every keyword that narrows what a model may send survives, with the
    /// annotations that tell it what to send. One row per kept keyword.
    #[test]
    fn every_narrowing_keyword_is_kept_as_it_is() {
        let table: &[(&str, Value, Value)] = &[
            ("const", json!({"type": "string"}), json!("only")),
            ("enum", json!({"type": "string"}), json!(["fast", "slow"])),
            ("pattern", json!({"type": "string"}), json!("^[a-z]+$")),
            ("format", json!({"type": "string"}), json!("date-time")),
            ("minimum", json!({"type": "integer"}), json!(1)),
            ("maximum", json!({"type": "number"}), json!(9.5)),
            ("exclusiveMinimum", json!({"type": "number"}), json!(0)),
            ("exclusiveMaximum", json!({"type": "number"}), json!(100)),
            ("multipleOf", json!({"type": "integer"}), json!(5)),
            ("minLength", json!({"type": "string"}), json!(1)),
            ("maxLength", json!({"type": "string"}), json!(64)),
            ("minItems", json!({"type": "array"}), json!(2)),
            ("maxItems", json!({"type": "array"}), json!(2)),
            ("uniqueItems", json!({"type": "array"}), json!(true)),
            ("minProperties", json!({"type": "object"}), json!(1)),
            ("maxProperties", json!({"type": "object"}), json!(3)),
            ("default", json!({"type": "integer"}), json!(10)),
            ("title", json!({"type": "string"}), json!("Query")),
            (
                "description",
                json!({"type": "string"}),
                json!("what to find"),
            ),
            (
                "items",
                json!({"type": "array"}),
                json!({"type": "string", "maxLength": 9}),
            ),
        ];
        for (keyword, base, value) in table {
            let mut property = base.clone();
            property[*keyword] = value.clone();
            let normalised = accepted(json!({"type": "object", "properties": {"p": property}}));
            assert_eq!(
                normalised["properties"]["p"][*keyword], *value,
                "{keyword} was not kept: {normalised}"
            );
        }
    }

    #[test]
    fn a_literal_stays_a_literal_and_a_bounded_list_stays_bounded() {
        // The issue's examples: `Literal["only"]` must not become any string, and a pair
        // (pydantic's `conlist(min_length=2, max_length=2)`) must not become any array.
        let normalised = accepted(json!({
            "type": "object",
            "properties": {
                "mode": {"const": "only", "type": "string", "title": "Mode"},
                "pair": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
            },
            "required": ["mode", "pair"]
        }));
        assert_eq!(
            normalised,
            json!({
                "type": "object",
                "properties": {
                    "mode": {"const": "only", "type": "string", "title": "Mode"},
                    "pair": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
                },
                "required": ["mode", "pair"]
            })
        );
    }

    #[test]
    fn keywords_that_constrain_nothing_are_dropped() {
        let normalised = accepted(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://example.com/search.json",
            "$comment": "internal",
            "type": "object",
            "properties": {
                "query": {"type": "string", "examples": ["x"], "x-vendor": 1, "deprecated": false}
            },
            "additionalProperties": false
        }));
        assert_eq!(
            normalised,
            json!({
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn combinators_not_and_additional_properties_schemas_are_normalised() {
        let normalised = accepted(json!({
            "type": "object",
            "properties": {
                "v": {
                    "anyOf": [{"type": "string", "x-a": "x"}, {"type": "null"}],
                    "not": {"type": "integer", "$comment": "t"}
                }
            },
            "additionalProperties": {"type": "number", "examples": [3]}
        }));
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

    /// The shape pydantic publishes for a nested model: `$defs` plus `$ref`s, one of them
    /// under `anyOf` for an optional field.
    #[test]
    fn local_refs_are_inlined_and_the_definitions_dropped() {
        let normalised = accepted(json!({
            "$defs": {
                "Address": {
                    "properties": {
                        "street": {"title": "Street", "type": "string"},
                        "zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"}
                    },
                    "required": ["street", "zip"],
                    "title": "Address",
                    "type": "object"
                }
            },
            "properties": {
                "home": {"$ref": "#/$defs/Address"},
                "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": null}
            },
            "required": ["home"],
            "title": "shipArguments",
            "type": "object"
        }));
        let address = json!({
            "properties": {
                "street": {"title": "Street", "type": "string"},
                "zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"}
            },
            "required": ["street", "zip"],
            "title": "Address",
            "type": "object"
        });
        assert_eq!(
            normalised,
            json!({
                "properties": {
                    "home": address,
                    "work": {"anyOf": [address, {"type": "null"}], "default": null}
                },
                "required": ["home"],
                "title": "shipArguments",
                "type": "object"
            })
        );
    }

    #[test]
    fn draft_seven_definitions_and_escaped_pointers_are_followed() {
        let normalised = accepted(json!({
            "type": "object",
            "definitions": {"a/b": {"type": "integer", "minimum": 0}, "c d": {"type": "boolean"}},
            "properties": {
                "n": {"$ref": "#/definitions/a~1b"},
                "f": {"$ref": "#/definitions/c%20d"}
            }
        }));
        assert_eq!(
            normalised["properties"]["n"],
            json!({"type": "integer", "minimum": 0})
        );
        assert_eq!(normalised["properties"]["f"], json!({"type": "boolean"}));
    }

    #[test]
    fn keywords_beside_a_ref_apply_with_it() {
        let normalised = accepted(json!({
            "type": "object",
            "$defs": {"Id": {"type": "string", "description": "an id", "maxLength": 8}},
            "properties": {
                // The site's description wins over the target's.
                "a": {"$ref": "#/$defs/Id", "description": "the order's id"},
                // A clash that is not an annotation keeps both under allOf.
                "b": {"$ref": "#/$defs/Id", "maxLength": 4}
            }
        }));
        assert_eq!(
            normalised["properties"]["a"],
            json!({"description": "the order's id", "type": "string", "maxLength": 8})
        );
        assert_eq!(
            normalised["properties"]["b"],
            json!({"maxLength": 4, "allOf": [{"type": "string", "description": "an id", "maxLength": 8}]})
        );
    }

    #[test]
    fn a_reference_used_twice_without_a_cycle_is_inlined_twice() {
        let normalised = accepted(json!({
            "type": "object",
            "$defs": {
                "Point": {"type": "object", "properties": {"x": {"type": "number"}}},
                "Line": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Point"}, "b": {"$ref": "#/$defs/Point"}}}
            },
            "properties": {"line": {"$ref": "#/$defs/Line"}}
        }));
        let point = json!({"type": "object", "properties": {"x": {"type": "number"}}});
        assert_eq!(normalised["properties"]["line"]["properties"]["a"], point);
        assert_eq!(normalised["properties"]["line"]["properties"]["b"], point);
    }

    /// M8 (amended): one row per way a tool is refused, with the words the operator reads.
    #[test]
    fn every_refusal_names_its_reason() {
        let table: Vec<(Value, &str)> = vec![
            (
                json!({"type": "object", "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}, "properties": {"head": {"$ref": "#/$defs/Node"}}}),
                "the schema is recursive: \"#/$defs/Node\" at properties.head.properties.next refers back to a schema that contains it",
            ),
            (
                json!({"type": "object", "properties": {"tree": {"type": "array", "items": {"$ref": "#"}}}}),
                "the schema is recursive: \"#\" at properties.tree.items",
            ),
            (
                json!({"type": "object", "properties": {"profile": {"$ref": "https://example.com/profile.json"}}}),
                "refers to \"https://example.com/profile.json\" at properties.profile, outside the tool's own schema; remote references are never fetched",
            ),
            (
                json!({"type": "object", "properties": {"p": {"$ref": "other.json#/a"}}}),
                "remote references are never fetched",
            ),
            (
                json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/Missing"}}}),
                "the schema's reference \"#/$defs/Missing\" at properties.p names nothing in the schema",
            ),
            (
                json!({"type": "object", "properties": {"p": {"$ref": "#addressDef"}}}),
                "is a plain-name anchor; only JSON pointers like \"#/$defs/Name\" are followed",
            ),
            (
                json!({"type": "object", "properties": {"p": {"$ref": 3}}}),
                "properties.p.$ref must be a string",
            ),
            (
                json!({"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}}}),
                "the schema uses prefixItems at properties.pair, which cannot be kept for model providers and cannot be dropped without widening what the tool accepts",
            ),
            (
                json!({"type": "object", "properties": {"pair": {"type": "array", "items": [{"type": "string"}]}}}),
                "the schema uses items as a list (the tuple form) at properties.pair",
            ),
            (
                json!({"type": "object", "properties": {"o": {"type": "object", "$id": "https://x/o", "properties": {}}}}),
                "$id (an embedded schema resource) at properties.o",
            ),
        ];
        for (schema, words) in table {
            let text = refusal(schema.clone()).to_string();
            assert!(
                text.contains(words),
                "{schema}\n  gave: {text}\n  want: {words}"
            );
            assert!(text.ends_with("the tool is refused"), "{text}");
        }
    }

    #[test]
    fn every_forbidden_keyword_refuses_the_tool_wherever_it_sits() {
        for &keyword in FORBIDDEN {
            let wrap = |inner: Value| -> Vec<(Value, &'static str)> {
                vec![
                    (
                        json!({"type": "object", "properties": {}, keyword: inner.clone()}),
                        "",
                    ),
                    (
                        json!({"type": "object", "properties": {"p": {"type": "object", keyword: inner.clone()}}}),
                        "properties.p",
                    ),
                    (
                        json!({"type": "object", "properties": {"p": {"anyOf": [{"type": "null"}, {"type": "string", keyword: inner.clone()}]}}}),
                        "properties.p.anyOf[1]",
                    ),
                    (
                        json!({"type": "object", "additionalProperties": {keyword: inner.clone()}}),
                        "additionalProperties",
                    ),
                    (
                        json!({"type": "object", "properties": {"l": {"type": "array", "items": {keyword: inner.clone()}}}}),
                        "properties.l.items",
                    ),
                    (
                        json!({"type": "object", "properties": {"n": {"not": {keyword: inner}}}}),
                        "properties.n.not",
                    ),
                    // Reached through a reference: refused where the reference sits.
                    (
                        json!({"type": "object", "$defs": {"d": {keyword: {}}}, "properties": {"r": {"$ref": "#/$defs/d"}}}),
                        "properties.r",
                    ),
                ]
            };
            for (schema, path) in wrap(json!({})) {
                assert_eq!(
                    refusal(schema),
                    SchemaRefusal::Forbidden {
                        keyword: keyword.to_owned(),
                        path: path.to_owned()
                    },
                    "{keyword} at {path:?}"
                );
            }
        }
    }

    #[test]
    fn an_unused_definition_is_not_looked_at() {
        let schema =
            json!({"type": "object", "$defs": {"unused": {"if": {}, "$ref": "https://x"}}});
        assert!(normalise_input_schema(&schema).is_ok());
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
    fn depth_counts_the_inlined_schemas() {
        // Twelve nested levels only once the chain of references is inlined.
        let mut defs = Map::new();
        defs.insert("d0".into(), json!({"type": "string"}));
        for i in 1..12 {
            defs.insert(format!("d{i}"), json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i - 1)}}}));
        }
        let fits = json!({"type": "object", "$defs": defs.clone(), "properties": {"a": {"$ref": "#/$defs/d10"}}});
        assert!(normalise_input_schema(&fits).is_ok());
        let deeper =
            json!({"type": "object", "$defs": defs, "properties": {"a": {"$ref": "#/$defs/d11"}}});
        assert!(matches!(refusal(deeper), SchemaRefusal::TooDeep { .. }));
    }

    #[test]
    fn references_that_fan_out_are_stopped_before_they_are_built() {
        // Each definition names the next one twice: 2^11 copies of the last, from a
        // schema of a few hundred bytes.
        let mut defs = Map::new();
        defs.insert(
            "d0".into(),
            json!({"type": "string", "description": "x".repeat(20)}),
        );
        for i in 1..11 {
            let prev = format!("#/$defs/d{}", i - 1);
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"a": {"$ref": prev}, "b": {"$ref": prev}}}),
            );
        }
        let schema =
            json!({"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d10"}}});
        let refused = refusal(schema);
        assert!(
            matches!(
                refused,
                SchemaRefusal::TooManySchemas { .. } | SchemaRefusal::TooLarge { .. }
            ),
            "{refused}"
        );
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
        let schema = json!({"type": "object", "$comment": "t".repeat(2 * MAX_ENCODED_BYTES)});
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
                json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}),
                "properties.a.maxLength must be a non-negative integer",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}}),
                "properties.a.pattern must be a string",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0}}}),
                "properties.a.multipleOf must be a number greater than 0",
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
            "$defs": {"N": {"type": ["integer", "null"], "minimum": 0}},
            "properties": {"b": {"type": "string", "format": "uri"}, "a": {"$ref": "#/$defs/N"}},
            "required": ["b"]
        });
        let once = accepted(schema.clone());
        let again = accepted(schema);
        assert_eq!(once.to_string(), again.to_string());
        let twice = accepted(once.clone());
        assert_eq!(once.to_string(), twice.to_string());
    }
}
