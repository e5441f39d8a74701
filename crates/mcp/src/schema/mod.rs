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

mod keywords;
mod references;
mod refusal;
#[cfg(test)]
mod tests;

use keywords::{CONSTRAINTS, STRUCTURE, check_constraint, check_type, forbid};
use references::merge;
pub(crate) use refusal::SchemaRefusal;
use refusal::malformed;

/// The deepest schema the normaliser accepts. The top-level schema is at depth 1 and
/// each nested schema (a property's value, an `allOf`/`anyOf`/`oneOf` entry, `not`,
/// `items`, or an `additionalProperties` schema) is one deeper than the schema that
/// holds it. An inlined reference sits at the depth of the `$ref` it replaces.
pub(crate) const MAX_DEPTH: usize = 12;

/// The largest normalised schema the normaliser accepts, in bytes of compact JSON.
pub(crate) const MAX_ENCODED_BYTES: usize = 16 * 1024;

/// The most schema objects a normalised schema may hold. Every schema object takes at
/// least two bytes (`{}`), so a schema past this count is over [`MAX_ENCODED_BYTES`]
/// anyway; counting while inlining stops a small schema whose references fan out (each
/// definition naming the next one twice) long before it is built.
pub(crate) const MAX_SCHEMAS: usize = MAX_ENCODED_BYTES / 2;

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
///   `additionalProperties`, `allOf`, `anyOf`, `oneOf`, `not`, `items`) and the ones that
///   narrow or annotate (`const`, `enum`, `pattern`, `format`, bounds, `default`, `title`,
///   ...). Keywords that constrain nothing (`$schema`, `$comment`, `examples`, vendor
///   `x-` keys, ...) are dropped, which never widens what the tool accepts.
/// - A validation keyword that cannot be kept (`prefixItems`, `if`, `patternProperties`,
///   the list form of `items`, ...) refuses the whole tool, as do schemas deeper than
///   [`MAX_DEPTH`], a normalised schema over [`MAX_ENCODED_BYTES`], and malformed kept
///   keywords.
///
/// Keys keep the order of the input's map, so the output depends on the input alone.
pub(crate) fn normalise_input_schema(schema: &Value) -> Result<Value, SchemaRefusal> {
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
}
